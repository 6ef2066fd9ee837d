"""The scheduler loop's ``Publisher`` in one process (embedded mode): an outbox drained by one task.

The shell queues each recorded batch's node commands and job-state events here, in decision order;
one delivery task hands the commands to the local node agents (``sink``) and the events to the
``subscribers``. Delivering outside the shell's lock lets an agent's ``deliver`` feed reports back
into ``SchedulerShell.handle`` without deadlock; an agent's or a subscriber's failure is logged and
the decision stands (the agent reports what it did).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpuquota.scheduler.loop import Commands, Deliveries, JobStates, Results
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.node_commands import NodeCommand

log = logging.getLogger(__name__)

NodeCommandSink = Callable[[NodeCommand], Awaitable[None]]
EventSubscriber = Callable[[SchedulerEvent], Awaitable[None]]


class LocalPublisher:
    """The loop's ``Publisher`` in one process: node commands to the local agents (``sink``) and
    job-state events to ``subscribers``, delivered by one task in decision order."""

    def __init__(self) -> None:
        self.sink: NodeCommandSink | None = None
        self.subscribers: list[EventSubscriber] = []
        self._outbox: asyncio.Queue[tuple[list[NodeCommand], list[SchedulerEvent]]] = asyncio.Queue()

    async def publish(self, records: JobStates, commands: Commands, results: Results = ()) -> Deliveries:
        """Queue for delivery (nothing waits for an in-process delivery: no awaitables)."""
        if commands or records:
            self._outbox.put_nowait((list(commands), [record.event for record in records]))
        return []

    async def idle(self) -> None:
        await self._outbox.join()

    async def deliver_forever(self) -> None:
        while True:
            commands, events = await self._outbox.get()
            try:
                await self._deliver(commands, events)
            finally:
                self._outbox.task_done()

    async def _deliver(self, commands: list[NodeCommand], events: list[SchedulerEvent]) -> None:
        sink = self.sink
        for command in commands:
            if sink is None:
                log.debug("no node command sink; dropped %s for %s", command.type, command.node_id)
                continue
            try:
                await sink(command)
            except Exception:  # the agent's own failure: the decision stands, the agent reports
                log.exception("delivering %s to node %s failed", command.type, command.node_id)
        for event in events:
            for subscriber in list(self.subscribers):
                try:
                    await subscriber(event)
                except Exception:
                    log.exception("job-state subscriber failed on %s", event.type)
