"""Replay a trace through the scheduling core in virtual time, for one configuration.

Theory of operation
-------------------
The engine is a shell like the embedded scheduler, with a virtual clock instead of a wall clock and
an event heap instead of node agents. The heap holds what will happen next: the trace's next
submission (the trace is streamed, one line ahead), the end of each running attempt (its start plus
what is left of its duration) and the stop of each attempt the core asked to stop (preemptions:
stopped at once, as the simulated runtime does). Each is turned into the input a node agent or the
gateway would send (``SubmitJob``, ``AttemptReport``) and fed to the core's ``step``; the events the
core returns say what to schedule next (a ``JobDispatched`` schedules the attempt's end, a
``JobPreempted`` its stop). Equal times run in the order they were scheduled.

A requeued job resumes from its last checkpoint when the trace gives ``checkpoint_every``, else from
scratch; the work between that checkpoint and the stop is the work lost. A configuration whose victim
order is S12's ``leastLostWork`` also tells the core what the node agent would: each attempt's start
(a RUNNING report) and each checkpoint (a RUNNING report with ``checkpoint_at``), so that the core
picks the victims that lose the least; without it the core needs neither and gets neither. Finished
jobs are dropped at once, so memory follows the jobs alive at a time, not the length of the trace.

Training plans (S11) add ticks: the heap holds a ``Tick`` at each opening and closing of their windows
(time is an input of the core: the window opens and closes on it, and the plan's jobs are preempted
at its close), and the events go through the read model's ``PlanTable`` for the plan's used and idle
GPU-hours.
"""

from __future__ import annotations

import gc
import heapq
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpuquota.core import ClusterState, step
from gpuquota.core.checkpoints import LEAST_LOST_WORK
from gpuquota.ctl.api import CliError
from gpuquota.read.plans import PlanTable
from gpuquota.sim.config import Configuration
from gpuquota.sim.estimate import plan_ticks
from gpuquota.sim.prefetch import TraceRow
from gpuquota.sim.stats import Sampler, ShareCounters, UnitLedger
from gpuquota.sim.trace import TraceJob
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobSpec
from gpuquota.wire.fast_construct import fast_construct

END, STOP, RUN, CHECKPOINT, TICK = 1, 2, 3, 4, 5
HEARTBEAT_TIMEOUT_MS = 2**62
"""Virtual nodes never miss a heartbeat (the engine sends no ticks)."""
Progress = Callable[[int, int], None]
"""``progress(jobs submitted, virtual now ms)``."""
Job = TraceJob | TraceRow
"""A trace's job: read here, or by ``gpuquota.sim.prefetch`` in a child process."""
Decision = tuple[str, str]
"""(``"dispatch"`` | ``"preempt"``, job id): the decision sequence, for the fidelity test."""


class SimJob:
    __slots__ = (
        "attempt_id",
        "checkpoint_ms",
        "count",
        "exit_code",
        "index",
        "node_id",
        "other_nodes",
        "remaining_ms",
        "started",
        "submitted",
        "unit",
        "waited",
    )

    def __init__(self, trace: Job, index: int, submitted: int) -> None:
        self.index = index
        self.unit = trace.unit
        self.count = trace.instances
        self.submitted = submitted
        self.remaining_ms = round(trace.duration * 1000)
        self.checkpoint_ms = None if trace.checkpoint_every is None else round(trace.checkpoint_every * 1000)
        self.exit_code = trace.exit_code
        self.attempt_id = ""
        self.node_id = ""
        self.other_nodes: tuple[str, ...] = ()
        """Nodes of the attempt but its first: a gang may span the pool's node and a plan's (S11)."""
        self.started = -1
        self.waited = False


@dataclass
class Result:
    """What one configuration did with the trace."""

    name: str
    shares: list[str]
    limits: list[int]
    """Each share's limit, all units together."""
    capacity: int
    counters: list[ShareCounters]
    used_ms: list[int]
    in_quota_ms: list[int]
    borrowed_ms: list[int]
    lent_ms: list[int]
    start_ms: int
    end_ms: int
    events: int
    inputs: int
    wall_seconds: float
    samples: Sampler
    decisions: list[Decision] | None = None
    unmatched: int = 0
    """Jobs of shares the configuration does not have."""
    plans: list[dict[str, Any]] = field(default_factory=list)
    """Each training plan as ``gpuquota plans`` lists it at the end (used and idle GPU-hours)."""


@dataclass
class Replay:
    config: Configuration
    record_decisions: bool = False
    progress: Progress | None = None
    state: ClusterState = field(default_factory=lambda: ClusterState(HEARTBEAT_TIMEOUT_MS))
    heap: list[tuple[int, int, int, str, str]] = field(default_factory=list)
    """(time, order of scheduling, END | STOP, job id, attempt id)."""
    jobs: dict[str, SimJob] = field(default_factory=dict)
    now: int = 0
    seq: int = 0
    inputs: int = 0
    events: int = 0
    unmatched: int = 0

    def __post_init__(self) -> None:
        self.shares = [s.name for s in self.config.shares]
        self.share_index = {name: i for i, name in enumerate(self.shares)}
        self.counters = [ShareCounters() for _ in self.shares]
        self.usage = [0] * len(self.shares)
        self.ledgers: dict[str, UnitLedger] = {}
        self.samples = Sampler(len(self.shares))
        self.decisions: list[Decision] | None = [] if self.record_decisions else None
        self.queue = self.config.queue.name
        self.report_checkpoints = self.config.victim_order() == LEAST_LOST_WORK
        self.plan_table = PlanTable() if self.config.plans else None
        self._on_event: dict[type[Any], Callable[[Any], None]] = {
            ev.JobDispatched: self._dispatched,
            ev.JobPreempted: self._preempted,
            ev.JobStopRequested: self._stop_requested,
            ev.JobRequeued: self._requeued,
            ev.JobSucceeded: self._succeeded,
            ev.JobFailed: self._failed,
        }

    # ----- driving ----------------------------------------------------------------------------

    def run(self, trace: Iterable[Job]) -> Result:
        started = time.perf_counter()
        jobs = iter(trace)
        first = next(jobs, None)
        self.now = 0 if first is None else round(first.submitted_at * 1000)
        start_ms = self.now
        self._setup(start_ms)
        from gpuquota.scheduler.loop import GC_THRESHOLDS  # the shells' setting: long-lived records

        thresholds = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            self._loop(first, jobs)
        finally:
            gc.unfreeze()
            gc.set_threshold(*thresholds)
        return self._result(start_ms, time.perf_counter() - started)

    def _setup(self, start_ms: int) -> None:
        for kind, fields in self.config.setup():
            for event in self._feed(kind, fields):
                if isinstance(event, ev.InputRejected):
                    raise CliError(f"{self.config.name}: {event.reason}")
        limits: dict[str, list[int]] = {}
        for unit, capacity in self.config.capacity().items():
            limits[unit] = [s.limit(unit) or 0 for s in self.config.shares]
            lends = [s.strategy.value != "RESERVE" for s in self.config.shares]
            self.ledgers[unit] = UnitLedger(capacity, limits[unit], lends, start_ms)
        for at in plan_ticks(self.state, start_ms, limit=None):
            self._push(at, TICK, "", "")

    def _loop(self, upcoming: Job | None, trace: Iterator[Job]) -> None:
        """The next submission waits beside the heap, not in it (one push and pop less per job); it
        keeps its place in the order of scheduling (``upcoming_seq``) for equal times."""
        heap, pop, jobs, report = self.heap, heapq.heappop, self.jobs, self._report
        submitted = 0
        upcoming_at = 0 if upcoming is None else round(upcoming.submitted_at * 1000)
        self.seq += 1
        upcoming_seq = self.seq
        while upcoming is not None or heap:
            if upcoming is not None and (
                not heap
                or upcoming_at < heap[0][0]
                or (upcoming_at == heap[0][0] and upcoming_seq < heap[0][1])
            ):
                self.now = upcoming_at
                self._submit(upcoming, submitted)
                submitted += 1
                upcoming = next(trace, None)
                if upcoming is not None:
                    upcoming_at = round(upcoming.submitted_at * 1000)
                    self.seq += 1
                    upcoming_seq = self.seq
                if self.progress is not None and submitted % 65_536 == 0:
                    self.progress(submitted, self.now)
                continue
            at, _, kind, job_id, attempt_id = pop(heap)
            self.now = at
            if kind == TICK:
                self._feed(inp.Tick, {})
                continue
            job = jobs.get(job_id)
            if job is not None and job.attempt_id == attempt_id:
                report(job_id, job, kind)

    def _push(self, at: int, kind: int, job_id: str, attempt_id: str) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, job_id, attempt_id))

    def _feed(self, kind: type[Any], fields: dict[str, Any]) -> list[ev.SchedulerEvent]:
        self.inputs += 1
        fields["event_id"] = str(self.inputs)
        fields["occurred_at"] = self.now
        events = step(self.state, fast_construct(kind, fields))
        self.events += len(events)
        handlers = self._on_event
        if self.plan_table is not None:
            for event in events:
                self.plan_table.apply(event)
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(event)
        return events

    def _submit(self, trace: Job, serial: int) -> None:
        index = self.share_index.get(trace.share)
        if index is None:
            self.unmatched += 1  # a share this configuration does not have
            return
        job_id = f"j{serial}"
        counters = self.counters[index]
        counters.submitted += 1
        job = self.jobs[job_id] = SimJob(trace, index, self.now)
        spec = fast_construct(  # a trace's values are validated already
            JobSpec,
            {
                "job_id": job_id,
                "job_name": trace.job_name or job_id,
                "job_queue": self.queue,
                "quota_share": trace.share,
                "priority": trace.priority,
                "unit": job.unit,
                "count": job.count,
                "created_at": self.now,
                "preemption_retries": trace.preemption_retries,
            },
        )
        self._feed(inp.SubmitJob, {"job": spec})
        if job_id in self.jobs and job_id not in self.state.jobs:
            counters.rejected += 1  # rejected by the core (no limit for the unit, DISABLED share, ...)
            del self.jobs[job_id]

    def _report(self, job_id: str, job: SimJob, kind: int) -> None:
        fields: dict[str, Any] = {"node_id": job.node_id, "job_id": job_id, "attempt_id": job.attempt_id}
        if kind in (RUN, CHECKPOINT):
            fields["status"] = "RUNNING"
            if kind == CHECKPOINT:
                fields["checkpoint_at"] = self.now
                self._next_checkpoint(job, job_id)
        elif kind == STOP:
            fields["status"] = "STOPPED"
        else:
            fields["status"] = "SUCCEEDED" if job.exit_code == 0 else "FAILED"
            fields["exit_code"] = job.exit_code
        self._feed(inp.AttemptReport, fields)
        if kind in (END, STOP):
            for node_id in job.other_nodes:  # every part reports its end; the attempt ends with the last
                if job.attempt_id != fields["attempt_id"]:
                    break
                self._feed(inp.AttemptReport, {**fields, "node_id": node_id})

    # ----- what the core decided --------------------------------------------------------------

    def _use(self, job: SimJob, delta: int) -> None:
        now, samples = self.now, self.samples
        if samples.next_at is None or samples.next_at <= now:
            samples.observe(now, self.usage)
        self.usage[job.index] += delta
        ledger = self.ledgers.get(job.unit)
        if ledger is not None:
            ledger.change(now, job.index, delta)

    def _dispatched(self, event: ev.JobDispatched) -> None:
        job = self.jobs[event.job_id]
        job.attempt_id = event.attempt_id
        job.node_id = event.placements[0].node_id
        job.other_nodes = tuple(p.node_id for p in event.placements[1:])
        job.started = self.now
        if not job.waited:
            job.waited = True
            self.counters[job.index].waits.add((self.now - job.submitted) / 1000)
        self._use(job, job.count)
        self._push(self.now + job.remaining_ms, END, event.job_id, event.attempt_id)
        if self.report_checkpoints:
            self._push(self.now, RUN, event.job_id, event.attempt_id)
            self._next_checkpoint(job, event.job_id)
        if self.decisions is not None:
            self.decisions.append(("dispatch", event.job_id))

    def _next_checkpoint(self, job: SimJob, job_id: str) -> None:
        """S12: the attempt's next checkpoint, if it comes before the attempt's end."""
        if job.checkpoint_ms is None:
            return
        done = self.now - job.started
        at = job.started + (done // job.checkpoint_ms + 1) * job.checkpoint_ms
        if at < job.started + job.remaining_ms:
            self._push(at, CHECKPOINT, job_id, job.attempt_id)

    def _preempted(self, event: ev.JobPreempted) -> None:
        self.counters[self.jobs[event.job_id].index].preemptions += 1
        if self.decisions is not None:
            self.decisions.append(("preempt", event.job_id))
        self._push(self.now, STOP, event.job_id, event.attempt_id)

    def _stop_requested(self, event: ev.JobStopRequested) -> None:
        self._push(self.now, STOP, event.job_id, event.attempt_id)

    def _stopped(self, job: SimJob) -> None:
        """The attempt is over before its end: keep the work up to the last checkpoint."""
        done = self.now - job.started
        saved = 0 if job.checkpoint_ms is None else done // job.checkpoint_ms * job.checkpoint_ms
        job.remaining_ms -= saved
        self.counters[job.index].lost_ms += (done - saved) * job.count
        self._release(job)

    def _release(self, job: SimJob) -> None:
        self._use(job, -job.count)
        job.attempt_id = ""
        job.started = -1

    def _requeued(self, event: ev.JobRequeued) -> None:
        job = self.jobs[event.job_id]
        if event.cause == "PREEMPTED":
            self._stopped(job)
        else:  # a retry after a failure, or a node that handed it back: it starts over
            self._release(job)

    def _succeeded(self, event: ev.JobSucceeded) -> None:
        job = self.jobs.pop(event.job_id)
        self.counters[job.index].finished += 1
        self._release(job)

    def _failed(self, event: ev.JobFailed) -> None:
        job = self.jobs.pop(event.job_id)
        counters = self.counters[job.index]
        counters.failed += 1
        if event.preempted:
            counters.failed_by_preemption += 1
            self._stopped(job)
        elif job.started >= 0:
            self._release(job)

    # ----- the result -------------------------------------------------------------------------

    def _result(self, start_ms: int, wall_seconds: float) -> Result:
        n = len(self.shares)
        totals: dict[str, list[int]] = {
            k: [0] * n for k in ("used", "in_quota", "borrowed", "lent", "limits")
        }
        for ledger in self.ledgers.values():
            ledger.advance(self.now)
            for i in range(n):
                totals["used"][i] += ledger.used_ms[i]
                totals["in_quota"][i] += ledger.in_quota_ms[i]
                totals["borrowed"][i] += ledger.borrowed_ms[i]
                totals["lent"][i] += ledger.lent_ms[i]
                totals["limits"][i] += ledger.limits[i]
        self.samples.observe(self.now, self.usage)
        return Result(
            name=self.config.name,
            shares=self.shares,
            limits=totals["limits"],
            capacity=sum(self.config.capacity().values()),
            counters=self.counters,
            used_ms=totals["used"],
            in_quota_ms=totals["in_quota"],
            borrowed_ms=totals["borrowed"],
            lent_ms=totals["lent"],
            start_ms=start_ms,
            end_ms=self.now,
            events=self.events,
            inputs=self.inputs,
            wall_seconds=wall_seconds,
            samples=self.samples,
            decisions=self.decisions,
            unmatched=self.unmatched,
            plans=[] if self.plan_table is None else self.plan_table.describe(self.now),
        )


def simulate(
    config: Configuration,
    trace: Iterable[Job],
    *,
    record_decisions: bool = False,
    progress: Progress | None = None,
) -> Result:
    return Replay(config, record_decisions, progress).run(trace)


def stderr_progress(name: str) -> Progress:
    started = time.perf_counter()

    def report(jobs: int, now_ms: int) -> None:
        elapsed = time.perf_counter() - started
        print(
            f"  {name}: {jobs:,} jobs, virtual day {now_ms / 86_400_000:.1f} ({elapsed:.0f} s)",
            file=sys.stderr,
        )

    return report
