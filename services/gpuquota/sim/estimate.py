"""When will a waiting job start? ``gpuquota explain`` adds an estimate by simulating forward.

From the scheduler's state (inside a trial that undoes every change), with no new arrivals: every
dispatched job ends at an assumed time, each end is fed to the core (``step``) as its node agent
would report it, and the core's own decisions (dispatches, preemptions, whose stops are immediate)
say when the job is dispatched.

- *likely*: a job ends at its dispatch plus the median duration observed for its share (the median of
  every share when its own has none yet; one hour when nothing has finished yet); a job already
  running for longer than that is assumed to end now.
- *latest*: a job ends at its attempt timeout (``attemptDurationSeconds``), an upper bound; when a job
  the answer depends on has no timeout, there is no bound and ``latestStartAt`` is null.

Training plans' windows (S11) open and close at known times: the run ticks at each of them, so a job
that waits for a window starts when it opens (and the plan's jobs are stopped when it closes).

Each answer says what it assumed. One forward run (a *sweep*) answers for every job waiting when it
starts: it goes on until all of them have been dispatched, recording when each was. ``Estimator``
keeps the sweeps of the last state version (``state.applied``), so the other jobs' estimates of that
version are look-ups. A sweep stops after ``MAX_STEPS`` ends (no answer then) or at its share of the
time budget (the answer is then "not before" the virtual time it reached); the gateway's explainer
(``gpuquota.sim.explainer``) runs them with no budget on a copy in a thread instead
(``gpuquota.sim.background``), whenever the state changes, so that
deep-queue jobs get a complete start from the newest finished run, which says how old it is.
"""

from __future__ import annotations

import gc
import heapq
import logging
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuquota.core import ClusterState, step
from gpuquota.core.plans import closes_at
from gpuquota.core.state import JobRecord, ShareKey
from gpuquota.read.model import ReadModel
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobStatus
from gpuquota.wire.fast_construct import fast_construct

log = logging.getLogger(__name__)
MAX_STEPS = 50_000
BUDGET_S = 0.18
LIKELY_BUDGET_S = 0.12
"""The estimate answers within ``BUDGET_S`` (an explain must stay quick): a forward run that needs
longer stops and says how far it got ("starts after ...")."""
DEFAULT_DURATION_MS = 3_600_000
MAX_AGE_MS = 10_000
EndOf = Callable[[JobRecord, int], int | None]
"""(dispatched job, now) -> when it ends, or None: unknown (no bound)."""


@dataclass(frozen=True)
class Sweep:
    """One forward run: when each job waiting at its start is first dispatched."""

    starts: dict[str, int]
    """Waiting job id -> virtual time of its first dispatch (the jobs the run got to)."""
    unbounded: int
    """How many of the jobs the run had to end had no known end (the jobs behind them have no start)."""
    not_before: int | None = None
    """When the run stopped at its time budget: the virtual time it reached (the others start later)."""


def observed_medians(read_model: ReadModel) -> dict[ShareKey, int]:
    """Median duration (dispatch to end, ms) of each share's succeeded jobs."""
    durations: dict[ShareKey, list[int]] = {}
    for job in read_model.jobs.values():
        last = job.attempts[-1] if job.attempts else None
        if job.status is JobStatus.SUCCEEDED and last is not None and last.stopped_at is not None:
            durations.setdefault(job.share, []).append(last.stopped_at - last.scheduled_at)
    return {share: int(statistics.median(values)) for share, values in durations.items()}


def likely_end(medians: dict[ShareKey, int]) -> EndOf:
    fallback = int(statistics.median(medians.values())) if medians else DEFAULT_DURATION_MS

    def end(job: JobRecord, now: int) -> int:
        started = job.scheduled_at if job.scheduled_at is not None else now
        return max(now, started + medians.get(job.share, fallback))

    return end


def latest_end(job: JobRecord, now: int) -> int | None:
    if job.attempt_duration_seconds is None:
        return None
    started = job.scheduled_at if job.scheduled_at is not None else now
    return max(now, started + job.attempt_duration_seconds * 1000)


def sweep(
    state: ClusterState,
    now: int,
    end_of: EndOf,
    budget_s: float = 3600.0,
    on_start: Callable[[str, int], None] | None = None,
    also: Iterable[str] = (),
) -> Sweep:
    """Run ``state`` forward (changing it) until every job waiting now has been dispatched, nothing more
    ends, or ``budget_s`` has passed: one run answers for the whole queue. ``on_start(job id, at)`` is
    called as each waiting job's start is found. ``also``: more jobs whose next dispatch to find (jobs
    being stopped, once requeued)."""
    deadline = time.perf_counter() + budget_s
    waiting = {job.job_id for job in state.jobs.values() if job.status is JobStatus.RUNNABLE} | set(also)
    starts: dict[str, int] = {}
    heap: list[tuple[int, int, str, str, str, str]] = []
    serial = 0
    unbounded = 0

    def schedule_end(job: JobRecord, at: int | None = None, status: str = "SUCCEEDED") -> None:
        nonlocal serial, unbounded
        end = at if at is not None else end_of(job, now)
        if end is None:
            unbounded += 1
            return
        serial += 1
        assert job.attempt_id is not None
        heapq.heappush(heap, (end, serial, job.job_id, job.attempt_id, job.placements[0].node_id, status))

    for job in _dispatched(state):
        schedule_end(
            job, now if job.stop is not None else None, "STOPPED" if job.stop is not None else "SUCCEEDED"
        )
    for at in plan_ticks(state, now):  # S11: windows open and close at known times
        serial += 1
        heapq.heappush(heap, (at, serial, "", "", "", TICK))

    def follow(events: Iterable[ev.SchedulerEvent], at: int) -> None:
        for event in events:
            if isinstance(event, ev.JobDispatched):
                if event.job_id in waiting and event.job_id not in starts:
                    starts[event.job_id] = at
                    if on_start is not None:
                        on_start(event.job_id, at)
                schedule_end(state.jobs[event.job_id])
            elif isinstance(event, ev.JobPreempted | ev.JobStopRequested):
                schedule_end(state.jobs[event.job_id], at, "STOPPED")

    for steps in range(MAX_STEPS):
        if not heap or len(starts) == len(waiting):
            break
        if steps % 16 == 0 and time.perf_counter() > deadline:
            return Sweep(starts, unbounded, not_before=now)
        now, _, ended, attempt_id, node_id, status = heapq.heappop(heap)
        if status == TICK:
            follow(_tick(state, now, f"estimate-{steps}"), now)
            continue
        fields = {"event_id": f"estimate-{steps}", "occurred_at": now, "node_id": node_id}
        fields |= {"job_id": ended, "attempt_id": attempt_id, "status": status}
        follow(step(state, fast_construct(inp.AttemptReport, fields)), now)
    return Sweep(starts, unbounded)


TICK = "TICK"
MAX_PLAN_TICKS = 200
"""At most this many future window openings and closings are ticked through (the nearest ones)."""


def plan_ticks(state: ClusterState, now: int, limit: int | None = MAX_PLAN_TICKS) -> list[int]:
    """The times after ``now`` at which training plans' windows open or close to work (S11), the
    first ``limit`` of them (``None``: all)."""
    times: set[int] = set()
    for plan in state.plans.values():
        for window in plan.windows:
            closes = closes_at(plan, window.start, window.end)
            if closes > window.start:
                times.update(t for t in (window.start, closes) if t > now)
    return sorted(times)[:limit]


def _tick(state: ClusterState, at: int, event_id: str) -> list[ev.SchedulerEvent]:
    """A ``Tick`` at ``at``, every online node heartbeating first: the run's nodes are not lost."""
    for node_id in sorted(n.node_id for n in state.nodes.values() if n.online):
        step(
            state,
            fast_construct(
                inp.NodeHeartbeat,
                {"event_id": f"{event_id}/{node_id}", "occurred_at": at, "node_id": node_id},
            ),
        )
    return step(state, fast_construct(inp.Tick, {"event_id": event_id, "occurred_at": at}))


def _dispatched(state: ClusterState) -> Iterable[JobRecord]:
    ids = sorted(i for share in state.shares.values() for group in share.dispatched.values() for i in group)
    return (state.jobs[i] for i in ids)


def trial_sweep(state: ClusterState, now: int, end_of: EndOf, budget_s: float) -> Sweep:
    """``sweep`` on the scheduler's own state inside a trial (the core's journal, as ``decide`` uses):
    every change is undone on the way out, which costs far less than copying the state. The caller
    must not let anything else touch the state meanwhile (the shells' single thread). The collector
    is off meanwhile: the journal's records are short-lived, and a collection walks every job."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with state.trial():
            return sweep(state, now, end_of, budget_s)
    finally:
        if collecting:
            gc.enable()


def _latest(state: ClusterState, now: int, budget_s: float) -> Sweep:
    running = list(_dispatched(state))
    if running and all(latest_end(job, now) is None for job in running):
        return Sweep({}, len(running))  # no running job has a bound: spare the run
    return trial_sweep(state, now, latest_end, budget_s)


@dataclass(frozen=True)
class Sweeps:
    """Both forward runs of one state version, and what they assumed."""

    version: tuple[int, int]
    """(identity of the state, events applied to it): a new event makes new sweeps."""
    estimated_at: int
    likely: Sweep
    latest: Sweep
    medians: dict[ShareKey, int]

    def answer(self, job_id: str) -> dict[str, Any]:
        likely, latest = self.likely, self.latest
        known = {share[1]: round(ms / 1000, 1) for share, ms in sorted(self.medians.items())}
        assumptions = [
            "no new submissions; preempted jobs stop at once",
            "likely: running jobs end at their share's median observed duration "
            + (
                f"(seconds: {known})"
                if known
                else f"(none observed yet: {DEFAULT_DURATION_MS // 1000} s assumed)"
            ),
            "latest: running jobs end at their attemptDurationSeconds"
            + (
                f" ({latest.unbounded} job(s) without one: no bound)"
                if job_id not in latest.starts and latest.unbounded
                else ""
            ),
        ]
        for name, run in (("likely", likely), ("latest", latest)):
            if job_id not in run.starts and run.not_before is not None:
                assumptions.append(
                    f"{name}: the estimate ran out of time; the job starts after {run.not_before}"
                )
        return {
            "likelyStartAt": likely.starts.get(job_id),
            "likelyNotBefore": None if job_id in likely.starts else likely.not_before,
            "latestStartAt": latest.starts.get(job_id),
            "latestNotBefore": None if job_id in latest.starts else latest.not_before,
            "estimatedAt": self.estimated_at,
            "assumptions": assumptions,
        }


class Estimator:
    """Start estimates of waiting jobs, from two sweeps per state version (cached until the state
    applies another event, or ``MAX_AGE_MS`` has passed: the running jobs' assumed ends move with
    the clock). The first estimate of a version pays for the sweeps (at most ``BUDGET_S``); every
    other job's estimate of that version is a look-up."""

    def __init__(self) -> None:
        self.sweeps: Sweeps | None = None

    def estimate(
        self, state: ClusterState, read_model: ReadModel, job_id: str, now: int
    ) -> dict[str, Any] | None:
        job = state.jobs.get(job_id)
        if job is None or job.status is not JobStatus.RUNNABLE:
            return None
        version = (id(state), state.applied)
        cached = self.sweeps
        if cached is None or cached.version != version or now - cached.estimated_at > MAX_AGE_MS:
            cached = self.sweeps = _sweeps(state, read_model, version, now)
        return cached.answer(job_id)


def _sweeps(state: ClusterState, read_model: ReadModel, version: tuple[int, int], now: int) -> Sweeps:
    medians = observed_medians(read_model)
    started = time.perf_counter()
    likely = trial_sweep(state, now, likely_end(medians), LIKELY_BUDGET_S)
    latest = _latest(state, now, max(0.01, BUDGET_S - (time.perf_counter() - started)))
    return Sweeps(version, now, likely, latest, medians)


def estimate(state: ClusterState, read_model: ReadModel, job_id: str, now: int) -> dict[str, Any] | None:
    """The start estimate of one waiting job (None for any other), without a cache."""
    return Estimator().estimate(state, read_model, job_id, now)
