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

Group commit: with a store that can append several records in one transaction (``BatchAppend``: SQLite
and the in-memory twin), ``handle`` queues its input and one drain task takes every input queued so far
as a batch: it ``step``s them one after another on the live state (the core's decide and evolve in one
pass, each input on the state its predecessors left; node commands come from the state just before each
event), appends the batch in one transaction, and only then folds the events into the read model, queues
the commands and answers the callers, in order. While a batch is being written the next one gathers, so a
burst of requests costs one commit (and one hop to the store's thread) instead of one each. If the
append fails the state is ahead of the log: the shell rebuilds it from the log and handles the batch's
inputs one at a time as above, so a duplicate or a store error affects only its own input. An input
whose ``step`` raises (a bug in the core) may have changed the state half-way: the shell rebuilds the
state from the log, re-applies the events of the batch's inputs before it and answers it with the error.
``group_commit=False`` (or a store without ``append_batch``) means one input per append.

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

from gpuquota.adapters.event_store import BatchAppend, DuplicateInput, Entry, EventStore
from gpuquota.commands import node_commands
from gpuquota.core import ClusterState, decide, evolve, step
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
Answer = asyncio.Future[list[SchedulerEvent]]

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
        group_commit: bool = True,
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
        self._batching = group_commit and isinstance(store, BatchAppend)
        self._queued: list[tuple[SchedulerInput, Answer]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._stale = False  # the state is ahead of the log (a batch failed): rebuild before deciding
        self.on_step: Callable[[float], None] | None = None
        """Called with the seconds each batch took to decide, record and apply (metrics)."""

    # ----- inputs ------------------------------------------------------------------------------

    def make(self, kind: type[M], **fields: Any) -> M:
        """A new input of ``kind`` stamped with a uuid4 event id and the clock's time."""
        return kind(event_id=str(uuid.uuid4()), occurred_at=self.clock(), **fields)

    def subscribe(self, subscriber: EventSubscriber) -> None:
        """Call ``subscriber`` with every job-state event (after it is recorded and applied)."""
        self.subscribers.append(subscriber)

    async def handle(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """Decide, record and apply ``message``; return its events ([] for a duplicate input)."""
        if not self._batching:
            async with self._lock:
                return await self._handle_one(message)
        answer: Answer = asyncio.get_running_loop().create_future()
        self._queued.append((message, answer))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain(), name="shell-batches")
        return await answer

    async def _handle_one(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """One input on its own: decide, append, evolve, project (the lock is held)."""
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
        self._apply(events, commands)
        return events

    def _apply(self, events: list[SchedulerEvent], commands: list[NodeCommand]) -> None:
        """The effects of recorded events: read model, then commands and notifications to deliver."""
        for event in events:
            self._project(event)
        published: list[SchedulerEvent] = [e for e in events if isinstance(e, ev.JOB_STATE_EVENTS)]
        if commands or published:
            self._outbox.put_nowait((commands, published))

    async def _drain(self) -> None:
        """Handle queued inputs batch by batch until none is left (the one task doing so)."""
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                started = time.perf_counter()
                try:
                    async with self._lock:
                        await self._handle_batch(batch)
                    if self.on_step is not None:
                        self.on_step(time.perf_counter() - started)
                except Exception as exc:
                    log.exception("a batch of %d inputs failed", len(batch))
                    for _, answer in batch:
                        if not answer.done():
                            answer.set_exception(exc)
                finally:
                    for _, answer in batch:  # only when cancelled (``stop``)
                        answer.cancel()
        finally:
            self._drainer = None
            for _, answer in self._queued:
                answer.cancel()
            self._queued = []

    async def _handle_batch(self, batch: list[tuple[SchedulerInput, Answer]]) -> None:
        if self._stale:
            await self._rebuild_state()
        decided: list[tuple[SchedulerInput, Answer, list[SchedulerEvent], list[NodeCommand]]] = []
        entries: list[Entry] = []
        commands: list[NodeCommand] = []

        def before(state: ClusterState, event: SchedulerEvent) -> None:
            commands.extend(node_commands(state, event))  # what the event means to the state it changes

        self._stale = True  # from the first step until the batch is recorded
        for message, answer in batch:
            commands = []
            try:
                events = step(self.state, message, before)  # decided and applied: the log is behind
            except Exception as exc:
                # step may have applied part of the input's events: back to the log, then the batch so far
                answer.set_exception(exc)
                await self._rebuild_state()
                self._stale = True
                for _, _, done, _ in decided:
                    for event in done:
                        evolve(self.state, event)
                continue
            decided.append((message, answer, events, commands))
            if events or not isinstance(message, _QUIET_INPUTS):
                entries.append((message, events))
        try:
            if entries:
                assert isinstance(self.store, BatchAppend)
                self.seq = await self.store.append_batch(self.pool, self.seq, entries)
        except Exception:
            # The state is ahead of the log: rebuild it, then one input at a time as without batches.
            await self._rebuild_state()
            for message, answer, _, _ in decided:
                try:
                    result = await self._handle_one(message)
                except Exception as exc:
                    if not answer.done():
                        answer.set_exception(exc)
                else:
                    if not answer.done():
                        answer.set_result(result)
            return
        self._stale = False
        for _, answer, events, commands in decided:
            self._apply(events, commands)
            if not answer.done():
                answer.set_result(events)

    async def _rebuild_state(self) -> None:
        """Fold the pool's log into a new ``ClusterState`` (the read model is left as it is)."""
        state = ClusterState(self.heartbeat_timeout_ms)
        after = 0
        while records := await self.store.read(self.pool, after_seq=after):
            for record in records:
                for event in record.events:
                    evolve(state, event)
                after = record.seq
        self.state = state
        self.seq = after
        self._stale = False

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
        if self._drainer is not None:
            self._tasks.append(self._drainer)
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
