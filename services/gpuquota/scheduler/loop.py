"""The scheduler's one loop: step -> append -> evolve -> node commands -> publish, over two ports.

Theory of operation
-------------------
Both modes run every input through the same pieces, in the same order, driven by the same batch driver
(``scheduler.driver``); what differs is the port each mode gives the driver (``shell.SchedulerShell``
answers callers in one process, ``pipeline.Pipeline`` handles Kafka records per pool with their
positions, dead letters and snapshots). The pieces, all in this module:

1. **one input** (``decide_one``): ``decide`` on the live state, append the input and its events
   (unless it is quiet, below), then ``evolve`` each event, collecting its ``Effects``. Nothing
   changes when the append fails (``DuplicateInput``: the driver skips the input).
2. **a batch** (``StepBatch``, group commit): each input is ``step``ped on the live state (the core's
   decide and evolve in one pass, ``core.step``: each input on the state its predecessors left), its
   effects collected and, if recordable, its ``BatchEntry`` kept; the driver then appends every entry
   in one transaction and publishes only once they are recorded. While the batch is being appended
   the state is ahead of the log: a driver whose append fails rebuilds the state (3).
   ``Effects.before`` is the step's hook: just before an event changes the state it derives what the
   event means outside the core, from the state it is about to change: the node commands
   (``scheduler.commands``), the job-state records to publish and, when the driver passes an
   ``Answerer`` (the distributed mode: ``answers``), the input's result (``input_result``). Quiet
   inputs (a tick or heartbeat that decided nothing) are not recorded (``recordable``).
3. **append** through the ``EventStore`` port by the ``Appender``: the loop's one append path. It
   retries a ``TransientStoreError`` with back-off for at most ``RetryPolicy.seconds`` and then fails
   the loop (``LoopFailed``: the embedded shell, whose callers wait; its supervisor restarts it and
   recovery is its normal start) or, in the distributed scheduler, stays unready and retries on
   (``give_up``: its inputs wait on Kafka, unacknowledged, until their append commits), recognises
   a retried append that had committed in transit, and times every append (``on_append``: the
   metrics).
4. **rebuild on failure**: if a batch's append fails the driver drops the state, its port folds the
   log again (``adapters.log_fold.fold_log``, the one fold: from the start in the embedded mode, from
   the latest snapshot in the distributed one) and the driver decides again the inputs that were not
   recorded.
5. **publish** the effects through the ``Publisher`` port, in decision order and only once recorded:
   the embedded mode's in-process publisher (``shell.LocalPublisher``: node agents in the process,
   job-state subscribers), the distributed mode's Kafka publisher (``faust_app.FaustPublisher``).

Two batches in flight, settling in order and redoing after a failed append are the driver's; what
stays in the modes is their port: the shell's answers to callers and read model; the pipeline's Kafka
positions, skipped and duplicate records, dead letters and snapshots at exact sequences.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gpuquota.adapters.event_store import (
    BatchEntry,
    DuplicateInput,
    EventStore,
    Position,
    TransientStoreError,
)
from gpuquota.core import ClusterState, decide, evolve, step
from gpuquota.scheduler.commands import node_commands
from gpuquota.support.retry import Backoff, Failure
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.input_results import InputResult, result_of
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_I = TypeVar("_I")
ShareKey = tuple[str, str]
OnAppend = Callable[[float, int], None]
"""Called with the seconds an append took and the number of records it wrote."""

QUIET_INPUTS = (inp.Tick, inp.NodeHeartbeat)

GC_THRESHOLDS = (20_000, 10, 10)
"""The collector of a process that runs the loop (``gpuquota up``, ``gpuquota scheduler``, the simulator).
Every job stays in memory (state, read model), so with Python's defaults (700, 10, 10) the embedded
collector ran about every 25 submissions, and a full collection, which walks every job (40 ms at 17,000
jobs), every few thousand: 15-35 us of CPU per submission in all; in the distributed scheduler a full
collection ran every 3-4 s at 1,000 jobs/s and found nothing, but held the event loop for 45-180 ms
each time (faust's, aiokafka's and pydantic's objects). Start-up's objects are frozen out of them."""


def recordable(message: SchedulerInput, events: Sequence[SchedulerEvent]) -> bool:
    """Whether the input goes into the log: it decided something, or it is not a tick or heartbeat."""
    return bool(events) or not isinstance(message, QUIET_INPUTS)


class LoopFailed(Exception):
    """The loop cannot continue (a publication failed, the store stayed unreachable)."""


@dataclass(frozen=True, slots=True)
class JobStateRecord:
    """A job event to publish, with the job's (queue, share) for the record's headers."""

    event: SchedulerEvent
    share: ShareKey | None
    cause: str | None = None
    """The event id of the input that caused the event (header ``input_event_id``)."""


JobStates = Sequence[JobStateRecord]
Commands = Sequence[NodeCommand]
Results = Sequence[InputResult]
Deliveries = list[Awaitable[object]]


class Publisher(Protocol):
    async def publish(self, records: JobStates, commands: Commands, results: Results = ()) -> Deliveries:
        """Hand the records to the transport, in order; return one delivery awaitable per record."""
        ...


def job_state(state: ClusterState, event: SchedulerEvent, cause: str) -> list[JobStateRecord]:
    """The job-state record of ``event`` (call before evolving it: the job may leave the state)."""
    if not isinstance(event, ev.JOB_STATE_EVENTS):
        return []
    if isinstance(event, ev.JobAccepted):
        return [JobStateRecord(event, (event.job.job_queue, event.job.quota_share), cause)]
    job = state.jobs.get(event.job_id)
    return [JobStateRecord(event, None if job is None else job.share, cause)]


def input_result(
    message: SchedulerInput, events: Sequence[SchedulerEvent], pool: str, now: int
) -> list[InputResult]:
    """The input's answer (``gpuquota.input-results``), if it is one that is answered."""
    answer = result_of(message, events, pool, now)
    return [] if answer is None else [answer]


Answerer = Callable[[SchedulerInput, Sequence[SchedulerEvent]], list[InputResult]]
"""The results of one recorded input: the distributed mode's (its producers wait for them on
``gpuquota.input-results``); the embedded shell answers its callers itself and has none."""


def answers(pool: str, clock: Callable[[], int]) -> Answerer:
    """The ``Answerer`` of ``pool``: each input's result, stamped with ``clock()`` when decided."""

    def answer(message: SchedulerInput, events: Sequence[SchedulerEvent]) -> list[InputResult]:
        return input_result(message, events, pool, clock())

    return answer


_NODE_NEWS = (ev.NodeLost, ev.NodeLossSuspended, ev.NodeLossResumed)


def log_node_news(event: SchedulerEvent) -> None:
    """What an operator must see in the scheduler's log: a node lost, node loss suspended or resumed."""
    if isinstance(event, ev.NodeLossSuspended):
        log.warning("node loss suspended in pool %s: %s", event.pool, event.reason)
    elif isinstance(event, ev.NodeLossResumed):
        log.warning(
            "node loss resumed in pool %s: node %s reported; every timer restarts", event.pool, event.node_id
        )
    elif isinstance(event, ev.NodeLost):
        log.warning("node %s lost: %s", event.node_id, event.reason)


class Effects:
    """What recorded events mean outside the core, collected in decision order.

    ``before`` is the hook ``core.step`` calls just before each event is applied; ``cause`` is the
    event id of the input being stepped (the header of its job-state records); ``answer``, if given,
    makes each recorded input's results (``answered``).
    """

    __slots__ = ("answer", "cause", "commands", "records", "results")

    def __init__(self, answer: Answerer | None = None) -> None:
        self.records: list[JobStateRecord] = []
        self.commands: list[NodeCommand] = []
        self.results: list[InputResult] = []
        self.cause = ""
        self.answer = answer

    def before(self, state: ClusterState, event: SchedulerEvent) -> None:
        self.records.extend(job_state(state, event, self.cause))
        self.commands.extend(node_commands(state, event))
        if isinstance(event, _NODE_NEWS):
            log_node_news(event)

    def answered(self, message: SchedulerInput, events: Sequence[SchedulerEvent]) -> None:
        """Collect the results of ``message``, recorded with ``events`` (with an ``answer`` only)."""
        if self.answer is not None:
            self.results.extend(self.answer(message, events))

    def __bool__(self) -> bool:
        return bool(self.records or self.commands or self.results)

    async def publish(self, publisher: Publisher) -> list[Awaitable[object]]:
        """Hand everything collected to ``publisher`` (nothing when empty)."""
        if not self:
            return []
        return await publisher.publish(self.records, self.commands, self.results)


@dataclass(slots=True)
class Decided:
    """One input decided, recorded (unless quiet) and applied, by ``decide_one``."""

    events: list[SchedulerEvent]
    effects: Effects
    seq: int | None
    """The log's last sequence after the append; None: a quiet input, not recorded."""


async def decide_one(
    appender: Appender,
    pool: str,
    seq: int,
    state: ClusterState,
    message: SchedulerInput,
    position: Position | None = None,
    answer: Answerer | None = None,
) -> Decided:
    """Decide ``message`` on ``state``, record it after ``seq`` (unless quiet), then apply its events.

    The state changes only once the input is recorded: a failed append (``DuplicateInput``: recorded
    before; an unreachable store, after the retries) is raised with the state as it was.
    """
    events = decide(state, message)
    effects = Effects(answer)
    if not recordable(message, events):
        return Decided(events, effects, None)
    seq = await appender.append(pool, seq, message, events, position)
    effects.cause = message.event_id
    effects.answered(message, events)
    for event in events:
        effects.before(state, event)
        evolve(state, event)
    return Decided(events, effects, seq)


class StepBatch(Generic[_I]):
    """Inputs stepped one after another on the live state: what to append in one transaction
    (``entries``) and what to publish once it is recorded (``effects``), in decision order.

    ``decided`` holds every item stepped with its events, ``recorded`` the items of ``entries`` and
    ``quiet`` those not recorded (``recordable``); an item is the driver's own (an input with its
    caller's answer, a Kafka record).
    """

    __slots__ = ("decided", "effects", "entries", "quiet", "recorded")

    def __init__(self, answer: Answerer | None = None) -> None:
        self.effects = Effects(answer)
        self.decided: list[tuple[_I, list[SchedulerEvent]]] = []
        self.recorded: list[_I] = []
        self.quiet: list[_I] = []
        self.entries: list[BatchEntry] = []

    @classmethod
    def of(cls, item: _I, one: Decided) -> StepBatch[_I]:
        """``one`` input, decided by ``decide_one``, as a batch (one way to settle both)."""
        batch: StepBatch[_I] = cls()
        batch.effects = one.effects
        batch.decided.append((item, one.events))
        (batch.recorded if one.seq is not None else batch.quiet).append(item)
        return batch

    def step(
        self, state: ClusterState, item: _I, message: SchedulerInput, position: Position | None = None
    ) -> bool:
        """Decide and apply ``message`` on ``state`` (the log is behind until the batch is appended);
        whether it is to be recorded.

        If the core raises, the input's effects are dropped and the error raised: the state may have
        changed half-way, and the driver must rebuild it from the log.
        """
        effects = self.effects
        effects.cause = message.event_id
        records, commands = len(effects.records), len(effects.commands)
        try:
            events = step(state, message, effects.before)
        except BaseException:
            del effects.records[records:], effects.commands[commands:]
            raise
        self.decided.append((item, events))
        if not recordable(message, events):
            self.quiet.append(item)
            return False
        effects.answered(message, events)
        self.entries.append((message, events, position))
        self.recorded.append(item)
        return True


@dataclass
class RetryPolicy:
    """How the loop waits for an unreachable store: back-off, bounded by ``seconds``; then fail, or,
    with ``give_up`` False (the distributed scheduler: its inputs wait on Kafka, unacknowledged), say
    so and go on retrying at the longest back-off: the service stays unready, its process alive."""

    seconds: float = 300.0
    initial: float = 0.05
    longest: float = 2.0
    give_up: bool = True
    available: bool = True
    """False while a call is retrying a ``TransientStoreError`` (the service's readiness)."""
    errors: int = 0
    warn: Callable[[str], None] | None = None
    """Called once when the store becomes unavailable (logging)."""
    on_error: Callable[[], None] | None = None
    """Called on every ``TransientStoreError`` (statistics)."""

    async def call(self, call: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``call()``, retried with back-off (``support.retry``) while the store is unreachable
        (``TransientStoreError``), deciding nothing meanwhile, for at most ``seconds``; then
        ``LoopFailed``, or with ``give_up`` False, retried on at the longest back-off."""

        def failed(failure: Failure) -> None:
            self.errors += 1
            if self.on_error is not None:
                self.on_error()
            if self.available and self.warn is not None:
                error = failure.error
                self.warn(f"{what}: store unavailable ({error}); retrying, deciding nothing meanwhile")
            self.available = False

        def recovered(failures: int) -> None:
            if self.warn is not None:
                self.warn(f"{what}: store available again after {failures} failed tries")

        bounded = Backoff(TransientStoreError, self.initial, self.longest, bound=self.seconds)
        try:
            result = await bounded.call(call, failed=failed, recovered=recovered)
        except TransientStoreError as exc:
            if self.give_up:
                raise LoopFailed(f"{what}: store unavailable for {self.seconds:g} s") from exc
            if self.warn is not None:
                waited = f"{self.seconds:g} s"
                self.warn(f"{what}: store unavailable for {waited} ({exc}); not ready, still retrying")
            unbounded = Backoff(TransientStoreError, self.longest, self.longest)
            result = await unbounded.call(call, failed=failed, recovered=recovered)
        self.available = True
        return result


class Appender:
    """The loop's one append path: retried by ``retry``, timed into ``on_append``."""

    def __init__(self, store: EventStore, retry: RetryPolicy, on_append: OnAppend | None = None) -> None:
        self.store = store
        self.retry = retry
        self.on_append = on_append

    async def append(
        self,
        pool: str,
        seq: int,
        message: SchedulerInput,
        events: Sequence[SchedulerEvent],
        position: Position | None = None,
    ) -> int:
        """Record one input after ``seq``; the new sequence."""
        store = self.store
        return await self._retried(
            pool, seq, [message.event_id], lambda: store.append(pool, seq, message, events, position)
        )

    async def append_many(self, pool: str, seq: int, entries: Sequence[BatchEntry]) -> int:
        """Record ``entries`` after ``seq`` in one transaction; the batch's last sequence."""
        store = self.store
        ids = [message.event_id for message, _, _ in entries]
        return await self._retried(pool, seq, ids, lambda: store.append_many(pool, seq, entries))

    async def _retried(
        self, pool: str, seq: int, input_ids: list[str], append: Callable[[], Awaitable[int]]
    ) -> int:
        """``append()`` of ``input_ids`` after ``seq``, retried like every store call.

        A ``DuplicateInput`` after a failed try means that try had committed in transit if the log's
        next records are exactly these inputs: that is success, not a duplicate.
        """
        tries = 0
        started = time.perf_counter()

        async def attempt() -> int:
            nonlocal tries
            tries += 1
            try:
                return await append()
            except DuplicateInput:
                if tries > 1 and await self._recorded_next(pool, seq, input_ids):
                    return seq + len(input_ids)
                raise

        result = await self.retry.call(attempt, f"pool {pool}: append")
        if self.on_append is not None:
            self.on_append(time.perf_counter() - started, len(input_ids))
        return result

    async def _recorded_next(self, pool: str, seq: int, input_ids: list[str]) -> bool:
        """Whether the log's next records after ``seq`` are ``input_ids``, in order."""
        following = await self.store.read(pool, after_seq=seq, limit=len(input_ids))
        return [record.input.event_id for record in following] == input_ids
