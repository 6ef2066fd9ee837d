"""The scheduler's one loop: step -> append -> evolve -> node commands -> publish, over two ports.

Theory of operation
-------------------
Both modes run every input through the same pieces, in the same order; only the driver around them
differs (``shell.SchedulerShell`` answers callers in one process, ``pipeline.Pipeline`` handles Kafka
records per pool with their positions, dead letters and snapshots):

1. **step**: ``decide`` and ``evolve`` on the live state in one pass (``core.step``), or ``decide``
   alone when the input is appended on its own. ``Effects.before`` is the step's hook: just before an
   event changes the state it derives what the event means outside the core, from the state it is
   about to change: the node commands (``scheduler.commands``) and the job-state records to publish.
   Quiet inputs (a tick or heartbeat that decided nothing) are not recorded (``recordable``).
2. **append** through the ``EventStore`` port, a batch in one transaction (group commit), by the
   ``Appender``: the loop's one append path. It retries a ``TransientStoreError`` with back-off for
   at most ``RetryPolicy.seconds`` and then fails the loop (``LoopFailed``: fail fast, the supervisor
   restarts the service and recovery is its normal start), recognises a retried append that had
   committed in transit, and times every append (``on_append``: the metrics).
3. **rebuild on failure**: while a batch is being appended the state is ahead of the log; if the
   append fails the driver folds the log again (``adapters.log_fold.fold_log``, the one fold: from
   the start in the embedded mode, from the latest snapshot in the distributed one).
4. **publish** the effects through the ``Publisher`` port, in decision order and only once recorded:
   the embedded mode's in-process publisher (``shell.LocalPublisher``: node agents in the process,
   job-state subscribers), the distributed mode's Kafka publisher (``faust_app.FaustPublisher``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gpuquota.adapters.event_store import (
    BatchEntry,
    DuplicateInput,
    EventStore,
    Position,
    TransientStoreError,
)
from gpuquota.core import ClusterState
from gpuquota.scheduler.commands import node_commands
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.input_results import InputResult, result_of
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand

_T = TypeVar("_T")
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


class Effects:
    """What recorded events mean outside the core, collected in decision order.

    ``before`` is the hook ``core.step`` calls just before each event is applied; ``cause`` is the
    event id of the input being stepped (the header of its job-state records).
    """

    __slots__ = ("cause", "commands", "records", "results")

    def __init__(self) -> None:
        self.records: list[JobStateRecord] = []
        self.commands: list[NodeCommand] = []
        self.results: list[InputResult] = []
        self.cause = ""

    def before(self, state: ClusterState, event: SchedulerEvent) -> None:
        self.records.extend(job_state(state, event, self.cause))
        self.commands.extend(node_commands(state, event))

    def __bool__(self) -> bool:
        return bool(self.records or self.commands or self.results)

    async def publish(self, publisher: Publisher) -> list[Awaitable[object]]:
        """Hand everything collected to ``publisher`` (nothing when empty)."""
        if not self:
            return []
        return await publisher.publish(self.records, self.commands, self.results)


@dataclass
class RetryPolicy:
    """How the loop waits for an unreachable store: back-off, bounded by ``seconds``, then fail."""

    seconds: float = 300.0
    initial: float = 0.05
    longest: float = 2.0
    available: bool = True
    """False while a call is retrying a ``TransientStoreError``."""
    errors: int = 0
    warn: Callable[[str], None] | None = None
    """Called once when the store becomes unavailable (logging)."""
    on_error: Callable[[], None] | None = None
    """Called on every ``TransientStoreError`` (statistics)."""

    async def call(self, call: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``call()``, retried with back-off while the store is unreachable (``TransientStoreError``),
        deciding nothing meanwhile, for at most ``seconds``; then ``LoopFailed``."""
        delay = self.initial
        deadline = time.monotonic() + self.seconds
        while True:
            try:
                result = await call()
                self.available = True
                return result
            except TransientStoreError as exc:
                self._unavailable(exc, deadline, what)
                await asyncio.sleep(delay)  # back-off before retrying
                delay = min(delay * 2, self.longest)

    def _unavailable(self, exc: TransientStoreError, deadline: float, what: str) -> None:
        self.errors += 1
        if self.on_error is not None:
            self.on_error()
        if self.available and self.warn is not None:
            self.warn(f"{what}: store unavailable ({exc}); retrying, deciding nothing meanwhile")
        self.available = False
        if time.monotonic() > deadline:
            raise LoopFailed(f"{what}: store unavailable for {self.seconds:g} s") from exc


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
