"""The imperative shell around the scheduling core for one process (embedded mode).

Theory of operation
-------------------
``handle(message)`` is the only way in; an ``asyncio.Lock`` makes inputs one sequence. For each input
the shell asks the core to ``decide``, appends the input and its events to the event store (the log is
the truth: nothing acts on a decision before it is recorded), then applies each event: it derives the
event's node commands from the state *before* the event (``node_commands``), ``evolve``s the state and
folds the event into the read model. Node commands and job-state events go to an outbox drained by one
delivery task, in decision order; delivering outside the lock lets a node agent's ``deliver`` feed
reports back into ``handle`` without deadlock.

``recover()`` rebuilds the state and the read model by folding the whole log of the pool. A tick task
feeds ``Tick`` (time passing: heartbeat expiry, timeouts, time limits) every ``tick_seconds``. Ticks and
heartbeats that decide nothing are not written to the log (replay folds events; they carry none).

Inputs the shell creates itself get ``occurred_at`` from its clock (epoch ms) and a uuid4 event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gpuquota.adapters.event_store import DuplicateInput, EventStore
from gpuquota.commands import node_commands
from gpuquota.core import ClusterState, decide, evolve
from gpuquota.readmodel import ReadModel
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import Message
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
NodeCommandSink = Callable[[NodeCommand], Awaitable[None]]
EventSubscriber = Callable[[SchedulerEvent], Awaitable[None]]
Clock = Callable[[], int]

_QUIET_INPUTS = (inp.Tick, inp.NodeHeartbeat)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SchedulerShell:
    """Holds the ``ClusterState``, the event store, the read model and the subscribers of one pool."""

    def __init__(
        self,
        store: EventStore,
        read_model: ReadModel | None = None,
        *,
        pool: str = "default",
        tick_seconds: float = 1.0,
        clock: Clock = wall_clock_ms,
        heartbeat_timeout_ms: int = 30_000,
    ) -> None:
        self.store = store
        self.read_model = read_model or ReadModel()
        self.pool = pool
        self.tick_seconds = tick_seconds
        self.clock = clock
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.state = ClusterState(heartbeat_timeout_ms)
        self.seq = 0
        self.node_command_sink: NodeCommandSink | None = None
        self.subscribers: list[EventSubscriber] = []
        self._lock = asyncio.Lock()
        self._outbox: asyncio.Queue[tuple[list[NodeCommand], list[SchedulerEvent]]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    # ----- inputs ------------------------------------------------------------------------------

    def make(self, kind: type[M], **fields: Any) -> M:
        """A new input of ``kind`` stamped with a uuid4 event id and the clock's time."""
        return kind(event_id=str(uuid.uuid4()), occurred_at=self.clock(), **fields)

    def subscribe(self, subscriber: EventSubscriber) -> None:
        """Call ``subscriber`` with every job-state event (after it is recorded and applied)."""
        self.subscribers.append(subscriber)

    async def handle(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """Decide, record and apply ``message``; return its events ([] for a duplicate input)."""
        async with self._lock:
            events = decide(self.state, message)
            if events or not isinstance(message, _QUIET_INPUTS):
                try:
                    self.seq = await self.store.append(self.pool, self.seq, message, events)
                except DuplicateInput:
                    return []
            commands: list[NodeCommand] = []
            for event in events:
                commands.extend(node_commands(self.state, event))
                evolve(self.state, event)
                self._project(event)
            published: list[SchedulerEvent] = [e for e in events if isinstance(e, ev.JOB_STATE_EVENTS)]
            if commands or published:
                self._outbox.put_nowait((commands, published))
            return events

    def _project(self, event: SchedulerEvent) -> None:
        """Fold ``event`` into the read model; a projection bug must not stop the scheduler."""
        try:
            self.read_model.apply(event)
        except Exception:
            log.exception("read model could not apply %s %s", event.type, event.event_id)

    # ----- life cycle --------------------------------------------------------------------------

    async def recover(self) -> int:
        """Rebuild state and read model from the pool's log; return the number of records folded."""
        async with self._lock:
            self.state = ClusterState(self.heartbeat_timeout_ms)
            self.read_model.reset()
            folded = 0
            after = 0
            while True:
                records = await self.store.read(self.pool, after_seq=after)
                if not records:
                    break
                for record in records:
                    for event in record.events:
                        evolve(self.state, event)
                        self._project(event)
                    after = record.seq
                    folded += 1
            self.seq = await self.store.last_seq(self.pool)
            return folded

    async def start(self) -> None:
        """Start the delivery task and, when ``tick_seconds`` > 0, the tick task."""
        self._tasks.append(asyncio.create_task(self._deliver_forever(), name="shell-delivery"))
        if self.tick_seconds > 0:
            self._tasks.append(asyncio.create_task(self._tick_forever(), name="shell-tick"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def idle(self) -> None:
        """Wait until every queued node command and notification has been delivered."""
        await self._outbox.join()

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds)
            try:
                await self.handle(self.make(inp.Tick))
            except Exception:
                log.exception("tick failed")

    async def _deliver_forever(self) -> None:
        while True:
            commands, events = await self._outbox.get()
            try:
                await self._deliver(commands, events)
            finally:
                self._outbox.task_done()

    async def _deliver(self, commands: list[NodeCommand], events: list[SchedulerEvent]) -> None:
        sink = self.node_command_sink
        for command in commands:
            if sink is None:
                log.debug("no node command sink; dropped %s for %s", command.type, command.node_id)
                continue
            try:
                await sink(command)
            except Exception:
                log.exception("delivering %s to node %s failed", command.type, command.node_id)
        for event in events:
            for subscriber in list(self.subscribers):
                try:
                    await subscriber(event)
                except Exception:
                    log.exception("job-state subscriber failed on %s", event.type)
