"""The scheduler loop's driver for one process (embedded mode); the loop itself is ``scheduler.loop``.

Theory of operation
-------------------
``handle(message)`` is the only way in; an ``asyncio.Lock`` makes inputs one sequence. For each input
the shell runs the loop's ``decide_one``: the core ``decide``s, the input and its events are appended to
the event store (the log is the truth: nothing acts on a decision before it is recorded), then each
event is applied: its node commands are derived from the state *before* the event (``loop.Effects``) and
the state ``evolve``s; the shell then feeds the events to the read side's ``Projector``
(``gpuquota.read.projection``, the gateway's read model in both modes). Node commands and job-state
events are published through the loop's ``Publisher`` port: here the in-process ``LocalPublisher``
(``scheduler.local_publisher``), an outbox drained by one delivery task, in decision order; delivering
outside the lock lets a node agent's ``deliver`` feed reports back into ``handle`` without deadlock.

Group commit: every store appends several records in one transaction (``append_many``), so ``handle``
queues its input and one drain task takes every input queued so far as a batch: it ``step``s them one
after another on the live state (the loop's ``StepBatch``, the same as the distributed pipeline's: the
core's decide and evolve in one pass, each input on the state its predecessors left; node commands come
from the state just before each event), appends the batch in one transaction, and only then folds the
events into the read model, queues the commands and answers the callers, in order. While a batch is
being written the next one gathers, so a burst of requests costs one commit instead of one each. (The
SQLite store writes on the event loop's thread, so its appends are done before the next batch is
decided; the overlap below is for a store that writes elsewhere, or waits for another writer's lock.)

Two batches in flight (``PIPELINE_DEPTH``): while one batch is being written the drain task decides the
next on the state the first left, and starts its append at once; that append names the sequence the
first ends at, and the store runs appends in order. Batches settle (read model, commands,
answers) strictly in log order, each only once its own append committed, so nothing acts on or answers
an input before it is recorded. If an append fails the state is ahead of the log: the shell waits for
the appends after it (they fail with ``StaleWriter``: the sequence they name was never reached),
rebuilds the state from the log and handles the failed batch's inputs, then the later batches', one at
a time as above, so a duplicate or a store error affects only its own input (when the failure failed
the shell, the later batches, not recorded, are answered with it). An input whose ``step`` raises (a
bug in the core) may have changed the state half-way: the shell settles the batch in flight before it,
rebuilds the state from the log, re-applies the events of the batch's inputs before it and answers it
with the error. ``group_commit=False`` means one input per append.

Other failures follow the loop's one policy: appends are retried while the store is unreachable, for at most
``store_retry_seconds``; then, or when a tick fails (a bug in the core or the store), the shell fails:
``wait()`` returns the error, ``handle`` refuses every later input with it, and ``gpuquota up`` exits 1
to be restarted (recovery is the normal start). An input that fails on its own is answered with its
error and the shell carries on.

A write the store refuses (``StoreWriteFailed``: the disk is full, an I/O error) is not retried: the
inputs of the failed batch are answered with it (the gateway's 503 with the reason), nothing of them
reaches the read model, and the state is rebuilt from the log as after any failed append. From then
on, until an append succeeds, inputs are handled one at a time (``decide_one``: the state changes
only once an input is recorded), so each refusal costs one failed append and no rebuild, and the
first input that is recorded (space freed) ends it by itself. ``write_failure`` says why meanwhile
(``/health/ready``); reads, ticks and the node agents' retries go on.

``recover()`` rebuilds the state and the read model by folding the whole log of the pool
(``fold_log``). A tick task feeds ``Tick`` (time passing: heartbeat expiry, timeouts, time limits)
every ``tick_seconds``. Ticks and heartbeats that decide nothing are not written to the log (replay
folds events; they carry none).

Inputs the shell creates itself get ``occurred_at`` from its clock (epoch ms) and a uuid7 event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuquota.adapters.event_store import DuplicateInput, EventStore, Record, StoreWriteFailed
from gpuquota.adapters.log_fold import fold_log
from gpuquota.core import ClusterState, evolve
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import ProjectionFailed, Projector
from gpuquota.scheduler import loop
from gpuquota.scheduler.local_publisher import EventSubscriber, LocalPublisher, NodeCommandSink
from gpuquota.support.clock import Clock, wall_clock_ms
from gpuquota.support.ids import uuid7
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import Message
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
Answer = asyncio.Future[list[SchedulerEvent]]
Pending = tuple[SchedulerInput, Answer]

__all__ = ["Clock", "LocalPublisher", "SchedulerShell", "wall_clock_ms"]

PIPELINE_DEPTH = 2
"""Batches in flight at most: one being written while the next is decided (more only queue up
behind the store's writes, and make a failure redo more inputs one at a time)."""


@dataclass(slots=True)
class _Batch:
    """A batch stepped on the live state, its append (None: nothing to record) possibly in flight."""

    stepped: loop.StepBatch[Pending]
    append: asyncio.Task[int] | None
    started: float


class SchedulerShell:
    """Holds the ``ClusterState``, the event store, the read model and the subscribers of one pool."""

    def __init__(
        self,
        store: EventStore,
        projector: Projector | None = None,
        *,
        pool: str = "default",
        tick_seconds: float = 1.0,
        clock: Clock = wall_clock_ms,
        heartbeat_timeout_ms: int = 30_000,
        group_commit: bool = True,
        store_retry_seconds: float = 30.0,
        on_append: loop.OnAppend | None = None,
    ) -> None:
        self.store = store
        self.projector = projector or Projector()
        self.pool = pool
        self.tick_seconds = tick_seconds
        self.clock = clock
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.state = ClusterState(heartbeat_timeout_ms)
        self.seq = 0
        self.publisher = LocalPublisher()
        retry = loop.RetryPolicy(store_retry_seconds, warn=log.warning)
        self.appender = loop.Appender(store, retry, on_append)
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._batching = group_commit
        self._queued: list[Pending] = []
        self._drainer: asyncio.Task[None] | None = None
        self._arrival: asyncio.Future[None] | None = None
        self._stale = False  # the state is ahead of the log (a batch failed): rebuild before deciding
        self.failure: BaseException | None = None
        self._failed = asyncio.Event()
        self.write_failure: str | None = None
        """Why the last append failed, while the store refuses writes (``StoreWriteFailed``); None once
        an append succeeds."""
        self._failing_since = 0.0
        self.on_step: Callable[[float], None] | None = None
        """Called with the seconds each batch took to decide, record and apply (metrics)."""

    @property
    def read_model(self) -> ReadModel:
        return self.projector.read_model

    @property
    def node_command_sink(self) -> NodeCommandSink | None:
        return self.publisher.sink

    @node_command_sink.setter
    def node_command_sink(self, sink: NodeCommandSink | None) -> None:
        self.publisher.sink = sink

    @property
    def subscribers(self) -> list[EventSubscriber]:
        return self.publisher.subscribers

    # ----- inputs ------------------------------------------------------------------------------

    def make(self, kind: type[M], **fields: Any) -> M:
        """A new input of ``kind`` stamped with a fresh input id (``ids.uuid7``) and the clock's time."""
        return kind(event_id=uuid7(), occurred_at=self.clock(), **fields)

    def subscribe(self, subscriber: EventSubscriber) -> None:
        """Call ``subscriber`` with every job-state event (after it is recorded and applied)."""
        self.publisher.subscribers.append(subscriber)

    async def handle(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """Decide, record and apply ``message``; return its events ([] for a duplicate input)."""
        if self.failure is not None:
            raise loop.LoopFailed(f"the scheduler failed: {self.failure!r}") from self.failure
        if not self._batching:
            async with self._lock:
                return await self._handle_one(message)
        answer: Answer = asyncio.get_running_loop().create_future()
        self._queued.append((message, answer))
        arrival = self._arrival
        if arrival is not None and not arrival.done():
            arrival.set_result(None)  # the drain task waits for inputs beside an append in flight
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain(), name="shell-batches")
        return await answer

    async def _handle_one(self, message: SchedulerInput) -> list[SchedulerEvent]:
        """One input on its own: decide, append, evolve, project (the lock is held)."""
        try:
            one = await loop.decide_one(self.appender, self.pool, self.seq, self.state, message)
        except DuplicateInput:
            return []
        if one.seq is not None:
            self.seq = one.seq
            self._written()
        self._project(one.events)
        await one.effects.publish(self.publisher)
        return one.events

    async def _drain(self) -> None:
        """Handle queued inputs batch by batch until none is left (the one task doing so).

        Up to ``PIPELINE_DEPTH`` batches are in flight: the next batch is decided while the one before
        it is being written, and its append names the sequence that one ends at. Batches settle (read
        model, publication, answers) strictly in order, each only once its append committed."""
        flight: deque[_Batch] = deque()
        try:
            while self._queued or flight:
                if self._may_gather(flight):
                    await self._first_of(flight[0].append, self._arrival_or_new())
                    continue
                batch: list[Pending] = []
                in_flight = list(flight)
                careful = self.write_failure is not None  # one at a time until a write succeeds
                try:
                    async with self._lock:
                        if self._queued and len(flight) < PIPELINE_DEPTH and not (careful and flight):
                            batch, self._queued = self._queued, []
                            if careful:
                                await self._handle_carefully(batch)
                                continue
                            decided = await self._decide_batch(batch, flight)
                            if decided is not None:
                                flight.append(decided)
                        else:
                            await self._settle(flight.popleft(), flight)
                except Exception as exc:  # the store failed while folding the log: fail fast
                    log.exception("the scheduler's batches failed")
                    self._fail(exc)
                    self._fail_answers(exc, batch, in_flight, flight)
        finally:
            self._drainer = None
            for pending in flight:
                if pending.append is not None:
                    pending.append.cancel()
                for (_, answer), _ in pending.stepped.decided:
                    answer.cancel()
            for _, answer in self._queued:
                answer.cancel()
            self._queued = []

    def _may_gather(self, flight: deque[_Batch]) -> bool:
        """Whether to wait for the next input too, not only for the oldest append: nothing is queued,
        there is room in flight and that append is still being written."""
        if self._queued or not flight or len(flight) >= PIPELINE_DEPTH:
            return False
        append = flight[0].append
        return append is not None and not append.done()

    def _arrival_or_new(self) -> asyncio.Future[None]:
        self._arrival = asyncio.get_running_loop().create_future()
        return self._arrival

    async def _first_of(self, *waits: asyncio.Future[Any] | None) -> None:
        await asyncio.wait([w for w in waits if w is not None], return_when=asyncio.FIRST_COMPLETED)
        self._arrival = None

    async def _decide_batch(self, batch: list[Pending], flight: deque[_Batch]) -> _Batch | None:
        """Step ``batch`` on the live state and start its append after the batches in ``flight``."""
        started = time.perf_counter()
        if self._stale and not flight:
            await self._rebuild_state()
        stepped: loop.StepBatch[Pending] = loop.StepBatch()
        self._stale = True  # from the first step until the batch is recorded
        for index, pending in enumerate(batch):
            try:
                stepped.step(self.state, pending, pending[0])
            except Exception as exc:
                recovered = await self._recover_from_step(stepped, flight)
                pending[1].set_exception(exc)  # after the batches before it were answered
                if not recovered:
                    # a batch before this one failed: this one was decided on a wrong state
                    rest = [done for done, _ in stepped.decided] + batch[index + 1 :]
                    await self._handle_each(rest)
                    return None
        append = None
        if stepped.entries:
            entries = stepped.entries
            append = asyncio.create_task(self.appender.append_many(self.pool, self.seq, entries))
            self.seq += len(entries)
        return _Batch(stepped, append, started)

    async def _recover_from_step(self, stepped: loop.StepBatch[Pending], flight: deque[_Batch]) -> bool:
        """After a ``step`` that raised (it may have applied part of its events): settle the batches
        in flight, fold the log again and re-apply ``stepped``; False if one in flight failed."""
        failed = False
        while flight:
            failed = not await self._settle(flight.popleft(), flight) or failed
        if failed:
            return False
        await self._rebuild_state()
        self._stale = True
        for _, done in stepped.decided:
            for event in done:
                evolve(self.state, event)
        return True

    async def _settle(self, batch: _Batch, later: deque[_Batch]) -> bool:
        """Wait for ``batch``'s append, then project, publish and answer it (False: it failed)."""
        decided = batch.stepped.decided
        try:
            if batch.append is not None:
                await batch.append
        except Exception as exc:
            log.warning("a batch of %d inputs failed (%r); redone one at a time", len(decided), exc)
            self._fail_if_fatal(exc)
            self._write_refused(exc)
            await self._redo_failed(batch, later)
            return False
        if batch.append is not None:
            self._written()
        self._stale = bool(later)
        for _, events in decided:
            self._project(events)
        await batch.stepped.effects.publish(self.publisher)
        for (_, answer), events in decided:
            if not answer.done():
                answer.set_result(events)
        if self.on_step is not None:
            self.on_step(time.perf_counter() - batch.started)
        return True

    async def _redo_failed(self, failed: _Batch, later: deque[_Batch]) -> None:
        """``failed``'s append did not commit, so those after it fail too (``StaleWriter``: they name
        the sequence it ends at): fold the log again and handle their inputs one at a time, in order."""
        after = list(later)
        later.clear()
        outcomes = await asyncio.gather(
            *(batch.append for batch in after if batch.append is not None), return_exceptions=True
        )
        if any(not isinstance(outcome, BaseException) for outcome in outcomes):
            self._fail(loop.LoopFailed("an append committed after one before it had failed"))
        await self._rebuild_state()
        for batch in [failed, *after]:
            pending = [done for done, _ in batch.stepped.decided]
            if self.failure is not None and batch is not failed:
                for _, answer in pending:  # fail fast: not recorded, and the shell takes no more
                    if not answer.done():
                        answer.set_exception(loop.LoopFailed(f"the scheduler failed: {self.failure!r}"))
                continue
            await self._handle_each(pending)

    def _fail_answers(
        self,
        exc: Exception,
        batch: list[Pending],
        in_flight: list[_Batch],
        flight: deque[_Batch],
    ) -> None:
        """Answer with ``exc`` every input taken from the queue and not answered yet."""
        answers = [answer for _, answer in batch]
        for pending in in_flight + list(flight):
            if pending.append is not None:
                pending.append.cancel()
            answers.extend(answer for (_, answer), _ in pending.stepped.decided)
        flight.clear()
        self._stale = True
        for answer in answers:
            if not answer.done():
                answer.set_exception(exc)

    async def _handle_each(self, pending: list[Pending]) -> None:
        """Handle ``pending`` one input at a time, as without batches (after a failure)."""
        for message, answer in pending:
            if answer.done():
                continue
            try:
                result = await self._handle_one(message)
            except Exception as exc:
                self._fail_if_fatal(exc)
                self._write_refused(exc)
                if not answer.done():
                    answer.set_exception(exc)
            else:
                if not answer.done():
                    answer.set_result(result)

    async def _handle_carefully(self, pending: list[Pending]) -> None:
        """While the store refuses writes: ``pending`` one input at a time, on the state of the log
        (each ``decide_one`` changes it only once its input is recorded), so a refusal needs no rebuild."""
        if self._stale:
            await self._rebuild_state()
        await self._handle_each(pending)

    async def _rebuild_state(self) -> None:
        """Fold the pool's log into a new ``ClusterState`` (the read model is left as it is)."""
        state = ClusterState(self.heartbeat_timeout_ms)
        self.seq, _ = await fold_log(self.store, self.pool, state)
        self.state = state
        self._stale = False

    def _project(self, events: Sequence[SchedulerEvent]) -> None:
        """Feed ``events`` to the read side; a projection bug must not stop the scheduler (the
        projector keeps it: ``/health/live`` fails)."""
        with contextlib.suppress(ProjectionFailed):
            self.projector.project(events)

    def _project_record(self, record: Record) -> None:
        self._project(record.events)

    # ----- failure -----------------------------------------------------------------------------

    def _write_refused(self, exc: BaseException) -> None:
        """Note a ``StoreWriteFailed``: inputs go one at a time, and ``write_failure`` says why."""
        if not isinstance(exc, StoreWriteFailed):
            return
        if self.write_failure is None:
            self._failing_since = time.monotonic()
            log.error("the event log cannot be written (%s): inputs are refused until a write succeeds", exc)
        self.write_failure = str(exc)

    def _written(self) -> None:
        """An append succeeded: the store takes writes again, if it had refused them."""
        if self.write_failure is not None:
            failed = time.monotonic() - self._failing_since
            log.warning("the event log is written again, after %.1f s of refused writes", failed)
            self.write_failure = None

    def _fail_if_fatal(self, exc: BaseException) -> None:
        """The loop's failure policy: an unreachable store (after its retries) fails the shell."""
        if isinstance(exc, loop.LoopFailed):
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            log.error("the scheduler failed: %r", exc)
            self.failure = exc
            self._failed.set()

    async def wait(self) -> BaseException:
        """Wait until the shell fails; the error."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    # ----- life cycle --------------------------------------------------------------------------

    async def recover(self) -> int:
        """Rebuild state and read model from the pool's log; return the number of records folded."""
        async with self._lock:
            self.state = ClusterState(self.heartbeat_timeout_ms)
            self.projector.reset()
            _, folded = await fold_log(self.store, self.pool, self.state, after=self._project_record)
            self.seq = await self.store.last_seq(self.pool)
            return folded

    async def start(self) -> None:
        """Start the delivery task and, when ``tick_seconds`` > 0, the tick task."""
        self._tasks.append(asyncio.create_task(self.publisher.deliver_forever(), name="shell-delivery"))
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
        await self.publisher.idle()

    async def _tick_forever(self) -> None:
        while self.failure is None:
            await asyncio.sleep(self.tick_seconds)
            try:
                await self.handle(self.make(inp.Tick))
            except StoreWriteFailed:
                continue  # noted (write_failure); the next tick decides the same again
            except Exception as exc:  # time stops for the whole pool: fail fast, to be restarted
                self._fail(exc)
