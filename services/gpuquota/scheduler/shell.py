"""The embedded mode's scheduler of one pool: callers' inputs in, their answers out.

Theory of operation
-------------------
``handle(message)`` is the only way in. It queues the input with its caller's answer (a future, the
driver's *item*, ``Pending``) and one drain task (``scheduler.intake``) hands everything queued so far
to the pool's batch driver (``scheduler.driver``) as one batch, with at most ``PIPELINE_DEPTH``
batches in flight: while
one is being written the next gathers and is decided on the state the first left, so a burst of
requests costs one commit instead of one each. (The SQLite store writes on the event loop's thread, so
its appends are done before the next batch is decided; the overlap is for a store that writes
elsewhere, or waits for another writer's lock.) How batches are stepped, appended, settled and redone
is the driver's; what is the embedded mode's own is its port (``_ShellPort``):

- its **live state** is the shell's ``ClusterState`` (``state``, ``seq``); it is rebuilt by folding the
  whole log of the pool (``fold_log``); the read model is left as it is;
- to **settle** a recorded batch is to feed its events to the read side's ``Projector``
  (``gpuquota.read.projection``: the gateway's read model in both modes; ``_project``), publish
  its node commands and job-state events, and answer the callers, in order;
- it redoes a failed batch **one input at a time** and appends a batch **at once** (``driver.Mode``),
  and an input whose step raises is answered with the error (the rest of its batch goes on);
- while the store refuses writes (``StoreWriteFailed``: the disk is full, an I/O error) inputs go
  down the serial path, so each refusal costs one failed append and no rebuild; ``write_failure`` says
  why (``/health/ready``) until the first input recorded ends it.

Node commands and job-state events are published through the loop's ``Publisher`` port: here the
in-process ``LocalPublisher`` (``scheduler.local_publisher``), an outbox drained by one delivery task,
in decision order; delivering outside the drain lets a node agent's ``deliver`` feed reports back into
``handle`` without deadlock. ``group_commit=False`` decides one input per append.

Failures follow the loop's one policy: appends are retried while the store is unreachable, for at most
``store_retry_seconds``; then, or when a tick fails (a bug in the core or the store), the shell fails:
``wait()`` returns the error, ``handle`` refuses every later input with it (and the batches in flight
after the failure are answered with it), and ``gpuquota up`` exits 1 to be restarted (recovery is the
normal start). An input that fails on its own is answered with its error and the shell carries on.

``recover()`` rebuilds the state and the read model by folding the whole log of the pool. A tick task
feeds ``Tick`` (time passing: heartbeat expiry, timeouts, time limits) every ``tick_seconds``. Ticks and
heartbeats that decide nothing are not written to the log (replay folds events; they carry none).

Inputs the shell creates itself get ``occurred_at`` from its clock (epoch ms) and a uuid7 event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuquota.adapters.event_store import EventStore, Position, Record, StaleWriter, StoreWriteFailed
from gpuquota.adapters.log_fold import fold_log
from gpuquota.core import DEFAULT_POLICY, ClusterState
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import ProjectionFailed, Projector
from gpuquota.scheduler import loop
from gpuquota.scheduler.driver import BatchDriver, Mode, Settled
from gpuquota.scheduler.intake import Intake
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

EMBEDDED = Mode(appends_at_once=True, redo_each=True, step_errors_fail=False)


@dataclass(eq=False)
class _Live:
    """The shell's live state (``driver.Live``)."""

    state: ClusterState
    seq: int
    dropped: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SchedulerShell:
    """Holds the ``ClusterState``, the event store, the read model and the subscribers of one pool."""

    def __init__(
        self,
        store: EventStore,
        projector: Projector | None = None,
        *,
        pool: str = "default",
        tick_seconds: float = DEFAULT_POLICY.tick_seconds,
        clock: Clock = wall_clock_ms,
        heartbeat_timeout_ms: int = DEFAULT_POLICY.heartbeat_timeout_ms,
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
        self.live = _Live(ClusterState(heartbeat_timeout_ms), 0)
        self.publisher = LocalPublisher()
        retry = loop.RetryPolicy(store_retry_seconds, warn=log.warning)
        self.appender = loop.Appender(store, retry, on_append)
        self.driver: BatchDriver[Pending, _Live] = BatchDriver(_ShellPort(self), self.appender, pool)
        self.group_commit = group_commit
        self.intake: Intake[Pending] = Intake(
            self.driver, depth=PIPELINE_DEPTH, on_failure=self._give_up, cancel=_cancel
        )
        self._tasks: list[asyncio.Task[None]] = []
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
    def state(self) -> ClusterState:
        return self.live.state

    @property
    def seq(self) -> int:
        return self.live.seq

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
        answer: Answer = asyncio.get_running_loop().create_future()
        self.intake.put((message, answer))
        return await answer

    def _give_up(self, exc: BaseException, batch: list[Pending]) -> None:
        """A batch failed for good (the store failed while folding the log, a commit after a failed
        one): the shell fails, and every input of the batch not answered yet is answered with it."""
        if not isinstance(exc, Exception):
            raise exc
        log.error("the scheduler's batches failed", exc_info=exc)
        self._fail(exc)
        self.live.dropped = True
        for _, answer in batch:
            if not answer.done():
                answer.set_exception(exc)

    # ----- the read side ------------------------------------------------------------------------

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

    async def rebuild(self) -> _Live:
        """Fold the pool's log into a new live state (the read model is left as it is)."""
        state = ClusterState(self.heartbeat_timeout_ms)
        seq, _ = await fold_log(self.store, self.pool, state)
        self.live = _Live(state, seq)
        return self.live

    async def recover(self) -> int:
        """Rebuild state and read model from the pool's log; return the number of records folded."""
        async with self.live.lock:
            state = ClusterState(self.heartbeat_timeout_ms)
            self.projector.reset()
            _, folded = await fold_log(self.store, self.pool, state, after=self._project_record)
            self.live = _Live(state, await self.store.last_seq(self.pool))
            return folded

    async def start(self) -> None:
        """Start the delivery task and, when ``tick_seconds`` > 0, the tick task."""
        self._tasks.append(asyncio.create_task(self.publisher.deliver_forever(), name="shell-delivery"))
        if self.tick_seconds > 0:
            self._tasks.append(asyncio.create_task(self._tick_forever(), name="shell-tick"))

    async def stop(self) -> None:
        if self.intake.task is not None:
            self._tasks.append(self.intake.task)
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


def _cancel(pending: Pending) -> None:
    pending[1].cancel()


class _ShellPort:
    """The embedded mode's side of the driver (``driver.Port``): callers' answers, the read model,
    the in-process publisher."""

    mode = EMBEDDED
    answer = None  # the shell answers its callers itself

    def __init__(self, shell: SchedulerShell) -> None:
        self.shell = shell

    @property
    def failure(self) -> BaseException | None:
        return self.shell.failure

    def message(self, item: Pending) -> SchedulerInput:
        return item[0]

    def position(self, item: Pending) -> Position | None:
        return None

    def done(self, item: Pending) -> bool:
        return item[1].done()

    async def live(self) -> _Live:
        live = self.shell.live
        return await self.shell.rebuild() if live.dropped else live

    def drop(self, live: _Live) -> None:
        live.dropped = True

    def serial(self, items: Sequence[Pending]) -> bool:
        """One input per append without group commit, and while the store refuses writes (each
        ``decide_one`` changes the state only once its input is recorded: a refusal needs no rebuild)."""
        return not items or not self.shell.group_commit or self.shell.write_failure is not None

    def todo(self, live: _Live, items: Sequence[Pending]) -> list[Pending]:
        return [item for item in items if not item[1].done()]

    def disowned(self, items: Sequence[Pending]) -> bool:
        return False

    def stepped(self, live: _Live, seq: int) -> None:
        pass

    async def settle(self, live: _Live, settled: Settled[Pending]) -> None:
        """Project, publish and answer a recorded batch, in order."""
        shell, batch = self.shell, settled.batch
        if settled.seq is not None:
            shell._written()
        for _, events in batch.decided:
            shell._project(events)
        await batch.effects.publish(shell.publisher)
        for (_, answer), events in batch.decided:
            if not answer.done():
                answer.set_result(events)
        if settled.grouped and shell.on_step is not None:
            shell.on_step(time.perf_counter() - settled.started)

    async def append_failed(self, live: _Live, batch: loop.StepBatch[Pending], exc: Exception) -> bool:
        log.warning("a batch of %d inputs failed (%r); redone one at a time", len(batch.decided), exc)
        self.shell._fail_if_fatal(exc)
        self.shell._write_refused(exc)
        return False

    def duplicate(self, item: Pending) -> None:
        if not item[1].done():
            item[1].set_result([])

    def stale(self, exc: StaleWriter) -> None:
        log.warning("pool %s: %s", self.shell.pool, exc)

    def failed(self, item: Pending, exc: Exception) -> None:
        self.shell._fail_if_fatal(exc)
        self.shell._write_refused(exc)
        if not item[1].done():
            item[1].set_exception(exc)

    def abandon(self, items: Sequence[Pending], exc: BaseException) -> None:
        """Fail fast: not recorded, and the shell takes no more."""
        failed = loop.LoopFailed(f"the scheduler failed: {exc!r}")
        for _, answer in items:
            if not answer.done():
                answer.set_exception(failed)
