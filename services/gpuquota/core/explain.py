"""Explanations as data: why a RUNNABLE job is not running, with the figures that decide it.

The reason codes, checked in this order (the first that applies is the answer):

- ``BEHIND_SHARE_HEAD``: another job of the share is first in line (S3.2, no backfill).
- ``WAITING_FOR_PREEMPTION``: capacity is being freed for this job by preemptions in progress (S4.3).
- ``SERVICE_ENVIRONMENT_DISABLED``: the job queue's service environment places no jobs.
- ``MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE``, ``MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED``,
  ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``: the job is blocked (S9.1, ``gpuquota.core.blocked``):
  it can never run as configured, or the pool's nodes do not offer enough slots; the message says so.
- ``NO_CAPACITY_FOR_UNIT``: the pool's capacity for the job's unit is taken by other environments.
- ``WAITING_FOR_MIN_RUNTIME``: within its share's limit, but the capacity it could reclaim is held by
  jobs protected by their share's ``gpuquota:minRuntimeSeconds`` (S10.1) until ``until``.
- ``WAITING_FOR_OWN_QUOTA``: the job is within its share's limit, but the capacity is in use and
  nothing borrowed can be reclaimed for it; or its share may not borrow and is at its limit.
- ``REBORROW_BACKOFF``: the share may borrow, but not before ``until`` (S10.2).
- ``BORROW_LIMIT_REACHED``: the share would exceed its borrow limit.
- ``IDLE_CAPACITY_RESERVED``: capacity is free but reserved for RESERVE shares' own jobs.
- ``NO_IDLE_CAPACITY``: the share may borrow, but nothing is idle.
- ``NO_FREE_SLOTS``: the quota allows it, but no node has enough free slots right now.
- ``READY``: the job fits; it will be dispatched by the next pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpuquota.core.blocked import INSUFFICIENT_INSTANCE_CAPACITY, blocked_reason
from gpuquota.core.hygiene import MIN_RUNTIME_TAG, borrow_blocked_until, protected_until
from gpuquota.core.quota import Figures, figures_for
from gpuquota.core.state import ClusterState, JobRecord
from gpuquota.wire.base import JobStatus, Strategy


@dataclass(frozen=True)
class Explanation:
    job_id: str
    status: str
    reason: str
    message: str
    position: int | None = None
    """0-based place of the job in its share's queue (0 = head)."""
    share_head: str | None = None
    figures: dict[str, int | None] = field(default_factory=dict)
    estimate: dict[str, object] | None = None
    """When a RUNNABLE job will likely and at the latest start: filled by the shells, not the core
    (``gpuquota.sim.estimate``: it simulates the state forward)."""
    until: int | None = None
    """Epoch ms until which the job waits for a gpuquota extension (S10), when that is the reason."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def explain(state: ClusterState, job_id: str, now: int | None = None) -> Explanation | None:
    """Why ``job_id`` is where it is; ``None`` for a job the core no longer tracks (finished).
    ``now`` (epoch ms) lets it say what a job waits for until when (S10); without it, it does not."""
    job = state.jobs.get(job_id)
    if job is None:
        return None
    if job.status is not JobStatus.RUNNABLE:
        reason = "STOPPING" if job.stop is not None else "DISPATCHED"
        message = (
            job.stop.reason
            if job.stop is not None
            else f"Attempt {job.attempt_id} holds {job.count} {job.unit}"
        )
        return Explanation(job_id, job.status.value, reason, message)
    share = state.shares[job.share]
    position = share.queue.index(job.queue_key)
    head = state.head(share)
    head_id = head.job_id if head is not None else None
    figures = figures_for(state, share, job.unit, job.count, exclude=job.job_id)
    reason, message = _runnable_reason(state, job, position, head_id, figures)
    until = None
    if now is not None and position == 0 and figures is not None and reason in _WAIT_EXTENSIBLE:
        reason, message, until = _hygiene_wait(state, job, figures, now) or (reason, message, None)
    return Explanation(
        job_id,
        job.status.value,
        reason,
        message,
        position,
        head_id,
        {} if figures is None else _numbers(figures),
        until=until,
    )


def _numbers(f: Figures) -> dict[str, int | None]:
    return {
        "demand": f.demand,
        "pool_capacity": f.capacity,
        "pool_usage": f.usage,
        "reserved_idle": f.reserved_idle,
        "held": f.held,
        "share_usage": f.share_usage,
        "share_limit": f.share_limit,
        "share_max": f.share_max,
        "free_slots": f.free_slots,
    }


def _runnable_reason(
    state: ClusterState, job: JobRecord, position: int, head_id: str | None, f: Figures | None
) -> tuple[str, str]:
    share = state.shares[job.share]
    if position > 0:
        return (
            "BEHIND_SHARE_HEAD",
            f"{position} job(s) ahead in quota share {job.share[1]}; head is {head_id}",
        )
    if job.job_id in state.holds:
        victims = len(state.holds[job.job_id].victims)
        return "WAITING_FOR_PREEMPTION", f"Waiting for {victims} preempted job(s) to stop"
    if f is None or not f.environment_enabled:
        return "SERVICE_ENVIRONMENT_DISABLED", "The job queue's service environment is missing or DISABLED"
    if (blocked := _blocked(state, job)) is not None:
        return blocked
    if f.capacity == 0:
        return "NO_CAPACITY_FOR_UNIT", f"No capacity for {job.unit} in the service environment or its pool"
    if f.in_quota and not f.within_capacity:
        return "WAITING_FOR_OWN_QUOTA", (
            f"Within quota ({f.share_usage}+{f.demand} <= {f.share_limit}) but the pool is full "
            f"({f.usage} used + {f.reserved_idle} reserved of {f.capacity}) "
            "and nothing borrowed can be reclaimed"
        )
    if not f.in_quota and share.spec.strategy is not Strategy.LEND_AND_BORROW:
        return "WAITING_FOR_OWN_QUOTA", (
            f"Share {job.share[1]} ({share.spec.strategy.value}) is at its limit "
            f"({f.share_usage}/{f.share_limit}) and may not borrow"
        )
    if not f.within_share_max:
        return (
            "BORROW_LIMIT_REACHED",
            f"Share usage {f.share_usage}+{f.demand} would exceed its maximum {f.share_max}",
        )
    if not f.within_capacity:
        if f.usage + f.demand <= f.capacity:
            return (
                "IDLE_CAPACITY_RESERVED",
                f"{f.reserved_idle} idle instance(s) are reserved by RESERVE shares",
            )
        return "NO_IDLE_CAPACITY", f"No idle capacity to borrow ({f.usage} used of {f.capacity})"
    if not f.placeable:
        return "NO_FREE_SLOTS", f"Needs {f.demand} free slots; {f.free_slots} free on usable nodes"
    return "READY", "The job fits and will be dispatched by the next scheduling pass"


def _blocked(state: ClusterState, job: JobRecord) -> tuple[str, str] | None:
    """S9.1: a head job that cannot run however long it waits; the advice says so (not "wait")."""
    environment = state.environment_of_queue(job.share[0])
    if environment is None:
        return None
    found = blocked_reason(state, environment, state.shares[job.share], job)
    if found is None:
        return None
    code, text = found
    if code == INSUFFICIENT_INSTANCE_CAPACITY:
        return code, f"{text}. It runs once nodes offering enough slots are online (or lower its demand)"
    return code, f"{text}. It can never run as configured: lower its demand or raise the limit"


_WAIT_EXTENSIBLE = frozenset(
    {"WAITING_FOR_OWN_QUOTA", "BORROW_LIMIT_REACHED", "IDLE_CAPACITY_RESERVED", "NO_IDLE_CAPACITY", "READY"}
)
"""Reasons behind which an S10 extension may be what the job really waits for."""


def _hygiene_wait(state: ClusterState, job: JobRecord, f: Figures, now: int) -> tuple[str, str, int] | None:
    """S10: the job waits for a protected victim's minimum runtime, or for its share's backoff."""
    share = state.shares[job.share]
    if not f.in_quota:
        until = borrow_blocked_until(share, now)
        if until is None:
            return None
        return "REBORROW_BACKOFF", f"Quota share {job.share[1]} may not borrow again until {until}", until
    if f.within_capacity:
        return None
    protected = [
        until
        for other in state.shares.values()
        if other.key != share.key and other.usage.get(job.unit, 0) > other.limits.get(job.unit, 0)
        for ids in (other.dispatched.get(job.unit, ()),)
        for job_id in ids
        if (until := protected_until(state, state.jobs[job_id], now)) is not None
    ]
    if not protected:
        return None
    until = min(protected)
    return (
        "WAITING_FOR_MIN_RUNTIME",
        f"The capacity it could reclaim is protected by {MIN_RUNTIME_TAG} until {until}",
        until,
    )
