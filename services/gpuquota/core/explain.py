"""Explanations as data: why a RUNNABLE job is not running, with the figures that decide it, and
what would let it run.

Theory of operation
-------------------
Each reason is one small rule with its own message and ``action`` (the change that would unblock the
job, or "wait" and for what). Every figure a message prints is the one the rule decided on. The
reason codes, checked in this order (the first that applies is the answer):

- S9.1 codes (``MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE``,
  ``MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED``, ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``)
  for a job behind its share's head that can itself never run (``gpuquota.core.blocked``).
- ``BEHIND_BLOCKED_HEAD``: the share's head can never run, so the share is stalled behind it.
- ``BEHIND_SHARE_HEAD``: another job of the share is first in line (S3.2, no backfill).
- ``WAITING_FOR_PREEMPTION``: capacity is being freed for this job by preemptions in progress (S4.3).
- ``SERVICE_ENVIRONMENT_DISABLED``: the job queue's service environment places no jobs.
- The S9.1 codes for the head: it can never run as configured, or the pool's nodes do not offer
  enough slots.
- ``NO_CAPACITY_FOR_UNIT``: the pool's slots for the job's unit are held by other environments.
- ``WAITING_FOR_MIN_RUNTIME``: within its share's limit, but the capacity it could reclaim is held by
  jobs protected by their share's ``gpuquota:minRuntimeSeconds`` (S10.1) until ``until``.
- ``WAITING_FOR_OWN_QUOTA``: the job is within its share's limit, but the capacity is in use and
  not enough borrowed capacity can be reclaimed for it; or its share may not borrow and the job does
  not fit its limit.
- ``REBORROW_BACKOFF``: the share may borrow, but not before ``until`` (S10.2).
- ``BORROW_LIMIT_REACHED``: the share would exceed its maximum M(s,u).
- ``IDLE_CAPACITY_RESERVED``: capacity is idle but reserved for RESERVE shares' own jobs.
- ``NO_IDLE_CAPACITY``: the share may borrow, but not enough is idle.
- ``NO_FREE_SLOTS``: the quota allows it, but the nodes do not have enough free slots right now.
- ``WAITING_FOR_TRAINING_PLAN``: one of the waiting reasons above, while a training plan's next
  window would give the job capacity (S11); ``until`` says when it opens.
- ``READY``: the job fits; it will be dispatched by the next pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Final

from gpuquota.core.blocked import MISCONFIGURATION, blocked, status_reason, unblock_action
from gpuquota.core.hygiene import MIN_RUNTIME_TAG, borrow_blocked_until, protected_until
from gpuquota.core.plans import waits_for
from gpuquota.core.quota import Figures, figures_for
from gpuquota.core.schedule import BACKFILL_SCAN
from gpuquota.core.state import LEND_AND_BORROW, ClusterState, JobRecord, ShareRecord
from gpuquota.wire.base import MAX_JOB_PRIORITY, JobStatus

Why = tuple[str, str, str]
"""(reason code, message with the figures, action that would let the job run)."""

READY: Final[Why] = ("READY", "The job fits and will be dispatched by the next scheduling pass", "")
WAIT_FOR_JOBS: Final = "Wait for running jobs to finish"
LISTED_VICTIMS: Final = 5
"""At most this many preempted jobs are named in a ``WAITING_FOR_PREEMPTION`` message."""


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
    action: str = ""
    """What would let the job run (or what it waits for); empty when it is not waiting."""

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
    figures = figures_for(state, share, job.unit, job.count, exclude=job.job_id)
    if position > 0 and head is not None:
        why = _behind(state, job, position, head)
    else:
        why = _head_reason(state, job, figures)
    until = None
    waits = None
    if now is not None and position == 0 and figures is not None and why[0] in _WAIT_EXTENSIBLE:
        waits = _hygiene_wait(state, job, figures, now)
    if waits is None and now is not None and position == 0 and why[0] in _PLAN_WAITABLE:
        waits = _plan_wait(state, job, why, now)
    if waits is not None:
        why, until = waits
    return Explanation(
        job_id,
        job.status.value,
        why[0],
        why[1],
        position,
        None if head is None else head.job_id,
        {} if figures is None else _numbers(figures),
        until=until,
        action=why[2],
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


# ----- jobs behind the head ----------------------------------------------------------------------


def _behind(state: ClusterState, job: JobRecord, position: int, head: JobRecord) -> Why:
    """A job behind its share's head: blocked itself, stalled by a blocked head, or waiting its turn."""
    return (
        _blocked_job(state, job)
        or _stalled_by(state, job, position, head)
        or _waits_turn(state, job, position, head)
    )


def _stalled_by(state: ClusterState, job: JobRecord, position: int, head: JobRecord) -> Why | None:
    """S3.2: without backfill nothing passes the head, so a head that can never run stalls its share."""
    environment = state.environment_of_queue(job.share[0])
    if environment is None or head.job_id in state.holds:
        return None
    found = blocked(state, environment, state.shares[job.share], head)
    if found is None:
        return None
    how = (
        "can never start as configured"
        if found[0].startswith(MISCONFIGURATION)
        else "cannot start until the pool's nodes offer enough slots"
    )
    message = (
        f"Quota share {job.share[1]} is blocked by job {head.job_id} (head of the share, which {how}: "
        f"it {found[1]}); {position} job(s) ahead{_backfill_note(state, job, position)}"
    )
    action = _either(f"Terminate {head.job_id}", *_jump_ahead(head), found[2])
    return "BEHIND_BLOCKED_HEAD", message, action


def _waits_turn(state: ClusterState, job: JobRecord, position: int, head: JobRecord) -> Why:
    message = (
        f"{position} job(s) ahead in quota share {job.share[1]}; head is {head.job_id}"
        f"{_backfill_note(state, job, position)}"
    )
    return "BEHIND_SHARE_HEAD", message, _either("Wait for the job(s) ahead to start", *_jump_ahead(head))


def _jump_ahead(head: JobRecord) -> list[str]:
    """S3.1: a higher priority than the head's puts the job first (none is higher than the maximum)."""
    if head.priority >= MAX_JOB_PRIORITY:
        return []
    return [f"raise this job's priority above {head.job_id}'s ({head.priority})"]


def _either(*options: str) -> str:
    """``"a, b, or c"``."""
    if len(options) < 3:
        return " or ".join(options)
    return ", ".join(options[:-1]) + ", or " + options[-1]


def _backfill_note(state: ClusterState, job: JobRecord, position: int) -> str:
    queue = state.queues.get(job.share[0])
    policy = None if queue is None else state.policies.get(queue.scheduling_policy)
    if policy is None or not policy.backfill or position > BACKFILL_SCAN:
        return ""
    return "; backfill lets it start before them once it fits"


# ----- the head ----------------------------------------------------------------------------------


def _head_reason(state: ClusterState, job: JobRecord, f: Figures | None) -> Why:
    share = state.shares[job.share]
    if job.job_id in state.holds:
        return _waiting_for_preemption(state, job)
    if f is None or not f.environment_enabled:
        return _environment_disabled(state, job)
    if (found := _blocked_job(state, job)) is not None:
        return found
    if f.capacity == 0:
        return _no_capacity_for_unit(state, job)
    if f.in_quota and not f.within_capacity:
        return _pool_full(share, f)
    if not f.in_quota and share.spec.strategy is not LEND_AND_BORROW:
        return _may_not_borrow(share, f)
    if not f.within_share_max:
        return _borrow_limit(share, f)
    if not f.within_capacity:
        return _idle_reserved(f) if f.usage + f.demand <= f.capacity else _no_idle(f)
    if not f.placeable:
        return _no_free_slots(f)
    return READY


def _blocked_job(state: ClusterState, job: JobRecord) -> Why | None:
    """S9.1: a job that cannot run however long it waits; its reason is its ``statusReason``."""
    environment = state.environment_of_queue(job.share[0])
    if environment is None:
        return None
    found = blocked(state, environment, state.shares[job.share], job)
    if found is None:
        return None
    return found[0], status_reason(found), unblock_action(found)


def _waiting_for_preemption(state: ClusterState, job: JobRecord) -> Why:
    victims = sorted(state.holds[job.job_id].victims)
    if not victims:
        return (
            "WAITING_FOR_PREEMPTION",
            "Its preempted jobs have stopped",
            "Wait for the next scheduling pass",
        )
    named = ", ".join(victims[:LISTED_VICTIMS]) + (", ..." if len(victims) > LISTED_VICTIMS else "")
    return (
        "WAITING_FOR_PREEMPTION",
        f"Waiting for {len(victims)} preempted job(s) to stop: {named}",
        "Wait: preempted jobs stop within their nodes' grace period",
    )


def _environment_disabled(state: ClusterState, job: JobRecord) -> Why:
    queue_name = job.share[0]
    queue = state.queues.get(queue_name)
    name = "" if queue is None else queue.service_environment
    if name not in state.environments:
        return (
            "SERVICE_ENVIRONMENT_DISABLED",
            f"Service environment {name} of job queue {queue_name} does not exist",
            f"Attach job queue {queue_name} to an existing service environment",
        )
    return (
        "SERVICE_ENVIRONMENT_DISABLED",
        f"Service environment {name} of job queue {queue_name} is DISABLED",
        f"Enable service environment {name}",
    )


def _no_capacity_for_unit(state: ClusterState, job: JobRecord) -> Why:
    """C(e,u) = 0 for a job that is not blocked: the pool offers enough slots, but other
    environments' jobs hold all of them (S2.1)."""
    environment = state.environments[state.queues[job.share[0]].service_environment]
    slots = state.pool_slots.get(environment.pool, {}).get(job.unit, 0)
    return (
        "NO_CAPACITY_FOR_UNIT",
        f"All {slots} {job.unit} slots of pool {environment.pool} are held by jobs of other service "
        "environments",
        f"Wait for them to finish, or give job queue {job.share[0]} a higher priority than their queues' "
        "(environments sharing a pool are served in that order)",
    )


def _pool_full(share: ShareRecord, f: Figures) -> Why:
    others_reserved = f.reserved_idle - f.own_reserved_idle
    free = max(0, f.capacity - f.usage - others_reserved)
    return (
        "WAITING_FOR_OWN_QUOTA",
        f"Within quota share {share.key[1]}'s limit ({f.share_usage} in use + {f.demand} needed <= "
        f"{f.share_limit}), but only {free} of the {f.capacity} {f.unit} are free for it ({f.usage} in use, "
        f"{others_reserved} reserved by other RESERVE shares) and not enough borrowed capacity can be "
        "reclaimed",
        WAIT_FOR_JOBS,
    )


def _may_not_borrow(share: ShareRecord, f: Figures) -> Why:
    return (
        "WAITING_FOR_OWN_QUOTA",
        f"Quota share {share.key[1]} ({share.spec.strategy.value}) may not borrow, and the job does not "
        f"fit its limit: {f.share_usage} in use + {f.demand} needed > {f.share_limit}",
        f"Wait until the share's jobs use at most {f.share_limit - f.demand} {f.unit}, or raise its limit",
    )


def _borrow_limit(share: ShareRecord, f: Figures) -> Why:
    most = f.share_max or 0  # bounded here: an unbounded share is always within its maximum
    return (
        "BORROW_LIMIT_REACHED",
        f"Quota share {share.key[1]} may hold at most {most} {f.unit} (limit {f.share_limit}, "
        f"borrowLimit {share.spec.borrow_limit}%): {f.share_usage} in use + {f.demand} needed > {most}",
        f"Wait until the share's jobs use at most {most - f.demand} {f.unit}, or raise its borrowLimit",
    )


def _idle_reserved(f: Figures) -> Why:
    return (
        "IDLE_CAPACITY_RESERVED",
        f"{f.capacity - f.usage} of the {f.capacity} {f.unit} are idle, but RESERVE shares reserve "
        f"{f.reserved_idle} for their own jobs; borrowing {f.demand} would take reserved capacity",
        "Wait: reserved capacity is never lent",
    )


def _no_idle(f: Figures) -> Why:
    return (
        "NO_IDLE_CAPACITY",
        f"Not enough idle capacity to borrow: {max(0, f.capacity - f.usage)} of the {f.capacity} "
        f"{f.unit} idle, it needs {f.demand}",
        WAIT_FOR_JOBS,
    )


def _no_free_slots(f: Figures) -> Why:
    return (
        "NO_FREE_SLOTS",
        f"Needs {f.demand} free {f.unit} slots at once; {f.free_slots} free for it on the pool's online, "
        "non-draining nodes",
        "Wait for running and stopping jobs to free their slots, or add nodes",
    )


# ----- S10 extensions ----------------------------------------------------------------------------

_WAIT_EXTENSIBLE = frozenset(
    {"WAITING_FOR_OWN_QUOTA", "BORROW_LIMIT_REACHED", "IDLE_CAPACITY_RESERVED", "NO_IDLE_CAPACITY", "READY"}
)
"""Reasons behind which an S10 extension may be what the job really waits for."""


def _hygiene_wait(state: ClusterState, job: JobRecord, f: Figures, now: int) -> tuple[Why, int] | None:
    """S10: the job waits for a protected victim's minimum runtime, or for its share's backoff."""
    share = state.shares[job.share]
    if not f.in_quota:
        until = borrow_blocked_until(share, now)
        if until is None:
            return None
        message = f"Quota share {job.share[1]} may not borrow again until {until}"
        return ("REBORROW_BACKOFF", message, "Wait for the share's reborrow backoff to end"), until
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
    message = f"The capacity it could reclaim is protected by {MIN_RUNTIME_TAG} until {until}"
    return ("WAITING_FOR_MIN_RUNTIME", message, "Wait for the protected jobs' minimum runtime to end"), until


# ----- S11 training plans ------------------------------------------------------------------------

_PLAN_WAITABLE = frozenset(
    {
        "WAITING_FOR_OWN_QUOTA",
        "BORROW_LIMIT_REACHED",
        "IDLE_CAPACITY_RESERVED",
        "NO_IDLE_CAPACITY",
        "NO_FREE_SLOTS",
        "NO_CAPACITY_FOR_UNIT",
    }
)
"""Reasons behind which a training plan's next window may be what the job waits for."""


def _plan_wait(state: ClusterState, job: JobRecord, why: Why, now: int) -> tuple[Why, int] | None:
    found = waits_for(state, job, now)
    if found is None:
        return None
    name, start = found
    message = f"The job waits for training plan {name} from {start} ({_utc(start)}): {why[1]}"
    return ("WAITING_FOR_TRAINING_PLAN", message, f"Wait for training plan {name}'s window"), start


def _utc(ms: int) -> str:
    """An epoch-ms instant as ISO 8601 UTC (a pure conversion: the core reads no clock)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
