"""What a configuration change would do, before it is made (``gpuquota apply --dry-run``).

Theory of operation
-------------------
``impact(state, inputs, now, end_of)`` answers from the scheduler's state as it is and the inputs
the change would send (the gateway's ``UpdateQuotaShare`` and its siblings, built but not sent).
It changes nothing: both of its runs are trials of the core (``ClusterState.trial``), undone on the
way out, so the caller may hand it the scheduler's own state (on the state's thread) or a copy.

1. *Before*: the shares' figures (limit, usage, borrowed, lent per unit), the running jobs that are
   reclaimable (below), and one forward run of the start estimator (``gpuquota.sim.estimate.sweep``,
   with the caller's ``end_of``: the *likely* ends) giving each queued job's start as things are.
2. *After*: the change's inputs go through the core one by one (``step``, as the scheduler would
   decide and apply them at ``now``). What the core decides at once is the change's immediate
   effect: ``JobPreempted`` and ``JobStopRequested`` name the running jobs it stops (their
   ``restartAt``: when the forward run dispatches them again, ``None`` if it does not), a
   ``JobDispatched`` a queued job that starts at once, an ``InputRejected`` an input the core refuses
   (the real apply would fail there too). Then the same figures, reclaimable jobs and forward run.

A running job is *reclaimable* when its share is borrowing its unit (``U > L``, S2) and the job is
among the first, in S4.1's victim order (lowest priority, most recently dispatched first), whose
instances cover what the share borrows: those are the jobs a reclaim would take first. The change
makes a job ``becomes_borrowing`` when it is reclaimable after and was not before (lowering a limit
turns a share's jobs above it into borrowers, S4.5; a lender turning RESERVE leaves its borrowers
with nothing to borrow from). ``start_changes`` lists the queued jobs whose start differs between
the two runs (``None``: no start found, e.g. the job can no longer run, or waits behind a job with no
known end). Time and ids are the caller's: the result depends on nothing but the arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuquota.core import ClusterState, step
from gpuquota.core.quota import attribute_lent, share_limit
from gpuquota.core.state import JobRecord, ShareKey, ShareRecord
from gpuquota.sim.estimate import EndOf, sweep
from gpuquota.wire import events as ev
from gpuquota.wire.base import JobStatus, Strategy
from gpuquota.wire.inputs import SchedulerInput

BUDGET_S = 5.0
"""How long each forward run may take; a longer one stops and says how far it got."""


@dataclass(frozen=True)
class Side:
    """The figures of one side (before or after the change)."""

    shares: dict[ShareKey, dict[str, Any]]
    reclaimable: dict[str, dict[str, Any]]
    """Job id -> the running job's row, for the jobs a reclaim would take first."""
    starts: dict[str, int]
    not_before: int | None
    """Where the forward run stopped at its time budget (``None``: it finished)."""


@dataclass
class AtOnce:
    """What the change's inputs decide at once, as ``step`` returns it."""

    preempted_now: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    started_now: set[str] = field(default_factory=set)

    def note(self, jobs: dict[str, dict[str, Any]], event: ev.SchedulerEvent) -> None:
        if isinstance(event, ev.JobPreempted | ev.JobStopRequested):
            kind = event.kind if isinstance(event, ev.JobPreempted) else event.cause
            self.preempted_now.append({**jobs[event.job_id], "kind": kind, "reason": event.status_reason})
        elif isinstance(event, ev.JobDispatched):
            self.started_now.add(event.job_id)
        elif isinstance(event, ev.InputRejected):
            self.rejected.append({"input": event.input_type, "reason": event.reason})


@dataclass(frozen=True)
class Impact:
    """What the change does at once and next, from ``now``."""

    now: int
    jobs: dict[str, dict[str, Any]]
    """Job id -> its row (id, name, queue, share, status, unit, instances), as of before the change."""
    before: Side
    after: Side
    at_once: AtOnce

    def as_json(self) -> dict[str, Any]:
        """``apply --dry-run -o json``'s ``impact``: times in ms since the epoch, moves in seconds."""
        before, after = self.before, self.after
        return {
            "at": self.now,
            "preempted_now": self.at_once.preempted_now,
            "becomes_borrowing": [
                row for job_id, row in sorted(after.reclaimable.items()) if job_id not in before.reclaimable
            ],
            "start_changes": self.start_changes(),
            "shares": [
                {
                    "jobQueue": key[0],
                    "quotaShareName": key[1],
                    "before": before.shares.get(key),
                    "after": after.shares.get(key),
                }
                for key in sorted(set(before.shares) | set(after.shares))
            ],
            "rejected": self.at_once.rejected,
            "complete": before.not_before is None and after.not_before is None,
        }

    def start_changes(self) -> list[dict[str, Any]]:
        """The queued jobs whose likely start moves, earliest new start first (no start: last)."""
        out = []
        for job_id, row in self.jobs.items():
            if row["status"] != JobStatus.RUNNABLE.value:
                continue
            was = self.before.starts.get(job_id)
            will = self.now if job_id in self.at_once.started_now else self.after.starts.get(job_id)
            if was == will:
                continue
            moved = None if was is None or will is None else round((will - was) / 1000, 1)
            out.append({**row, "before": was, "after": will, "movedSeconds": moved})
        return sorted(out, key=lambda r: (r["after"] is None, r["after"] or 0, r["job"]))


def impact(
    state: ClusterState,
    inputs: Sequence[SchedulerInput],
    now: int,
    end_of: EndOf,
    budget_s: float = BUDGET_S,
) -> Impact:
    """What ``inputs`` would do to ``state`` at ``now`` (the state is left as it was)."""
    jobs = {job.job_id: _row(job) for job in state.jobs.values()}
    with state.trial():
        before = _side(state, now, end_of, budget_s)
    at_once = AtOnce()
    with state.trial():
        for message in inputs:
            for event in step(state, message):
                at_once.note(jobs, event)
        stopped = [row["job"] for row in at_once.preempted_now]
        after = _side(state, now, end_of, budget_s, stopped)
    for row in at_once.preempted_now:
        row["restartAt"] = after.starts.get(row["job"])
    return Impact(now, jobs, before, after, at_once)


def _side(state: ClusterState, now: int, end_of: EndOf, budget_s: float, stopped: Iterable[str] = ()) -> Side:
    """The figures of ``state`` and its forward run (which changes the state: call in a trial); the
    run also finds when the ``stopped`` jobs run again."""
    shares = {key: _figures(state, share) for key, share in sorted(state.shares.items())}
    reclaimable = {job.job_id: _row(job) for job in _reclaimable(state)}
    run = sweep(state, now, end_of, budget_s, also=stopped)
    return Side(shares, reclaimable, dict(run.starts), run.not_before)


def _row(job: JobRecord) -> dict[str, Any]:
    queue, share = job.share
    status = job.status.value
    return {
        "job": job.job_id,
        "jobName": job.job_name,
        "jobQueue": queue,
        "quotaShareName": share,
        "status": status,
        "unit": job.unit,
        "instances": job.count,
    }


def _reclaimable(state: ClusterState) -> Iterable[JobRecord]:
    """Per share and unit, the running jobs a reclaim takes first, covering what the share borrows
    (less what its jobs already being stopped give back)."""
    for share in state.shares.values():
        for unit, victims in share.victims.items():
            stopping = sum(state.jobs[i].count for i in share.dispatched.get(unit, ()) if state.jobs[i].stop)
            borrowed = share.usage.get(unit, 0) - share_limit(share, unit) - stopping
            for _, _, job_id in victims:
                if borrowed <= 0:
                    break
                job = state.jobs[job_id]
                borrowed -= job.count
                yield job


def _figures(state: ClusterState, share: ShareRecord) -> dict[str, Any]:
    """One share's strategy, and per unit its limit, usage, borrowed, lent and reserved instances."""
    units = sorted(set(share.limits) | {u for u, n in share.usage.items() if n})
    lent = _lent(state, share)
    return {
        "strategy": share.spec.strategy.value,
        "limits": {u: share_limit(share, u) for u in units},
        "usage": {u: share.usage.get(u, 0) for u in units},
        "borrowed": {u: max(0, share.usage.get(u, 0) - share_limit(share, u)) for u in units},
        "lent": {u: lent.get(u, 0) for u in units},
        "reserved": {u: _reserved(share, u) for u in units},
    }


def _reserved(share: ShareRecord, unit: str) -> int:
    """The share's idle capacity that nobody else may use (RESERVE, S2.4)."""
    if share.spec.strategy is not Strategy.RESERVE:
        return 0
    return max(0, share_limit(share, unit) - share.usage.get(unit, 0))


def _lent(state: ClusterState, share: ShareRecord) -> dict[str, int]:
    """What ``share`` lends per unit, attributed as ``gpuquota shares`` does (``attribute_lent``)."""
    environment = state.environment_of_queue(share.key[0])
    if environment is None:
        return {}
    siblings = sorted(state.shares_of_queue(share.key[0]), key=lambda s: s.key)
    index = next(i for i, s in enumerate(siblings) if s.key == share.key)
    out = {}
    for capacity in environment.capacity_limits:
        unit = capacity.unit
        limits = [share_limit(s, unit) for s in siblings]
        used = [s.usage.get(unit, 0) for s in siblings]
        lends = [s.spec.strategy is not Strategy.RESERVE for s in siblings]
        given = attribute_lent(capacity.max_capacity, limits, used, lends).get(index, 0)
        if given:
            out[unit] = given
    return out
