"""Blocked jobs (semantics S9.1): the one home of AWS's reasons for a job that cannot run.

Theory of operation
-------------------
A RUNNABLE job that merely waits (its turn behind its share's head, or for capacity its share will
get back) is not blocked. A job is **blocked** when, as things are configured or as the nodes are, it
cannot run however long it waits:

- ``MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE``: more than the service environment's limit;
- ``MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED``: more than its share may ever hold, M(s,u);
- ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``: within the limits, but the pool's online, non-draining
  nodes do not offer that many slots of the unit in total.

Whether a job is blocked depends only on its demand and on its *bounds*: the environment's limit,
M(s,u) and the pool's slots. It changes when a job enters a queue (submitted or requeued) or when a
bound changes (configuration, nodes), never with dispatches or reports.

The scheduling pass records each change (``record_blocked``) as ``JobBlocked`` or ``JobUnblocked``,
so the reason is in the log and in the read model's ``statusReason``:

- the share's head, in ``ShareRecord.blocked`` with since when: it drives
  ``jobStateTimeLimitActions`` (S9.2), which act on heads only, as AWS's do;
- any other blocked job of the share, in ``ShareRecord.blocked_behind``: a job that can never run
  says so wherever it waits (AWS says so only once it reaches the head).

Each code has one remedy (``remedy``): the change of configuration or nodes that would unblock it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, cast

from gpuquota.core.context import Context
from gpuquota.core.lifecycle import JOB_TRANSITIONS
from gpuquota.core.quota import environment_limit, max_usage, plans_could_add
from gpuquota.core.state import LEND_AND_BORROW, RUNNABLE, ClusterState, JobRecord, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire.base import ServiceEnvironmentSpec

MISCONFIGURATION: Final = "MISCONFIGURATION:"
"""The prefix of the codes of jobs that can never run as configured (the other waits for nodes)."""
SERVICE_ENVIRONMENT_MAX_RESOURCE: Final = "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE"
QUOTA_MANAGEMENT_LIMIT_EXCEEDED: Final = "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
INSUFFICIENT_INSTANCE_CAPACITY: Final = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
BLOCKED_CODES: Final = (
    SERVICE_ENVIRONMENT_MAX_RESOURCE,
    QUOTA_MANAGEMENT_LIMIT_EXCEEDED,
    INSUFFICIENT_INSTANCE_CAPACITY,
)
TIME_LIMIT_REASON: Final = "Terminated by JobStateTimeLimit action due to reason: {code}"
"""S9.2: the status reason of a job failed by a ``jobStateTimeLimitActions`` entry."""

Found = tuple[str, str, str, int]
"""(code, what the job needs against its bound, the remedy, the bound) of a blocked job."""

_BOUNDS_KEPT: Final = frozenset(
    {
        *JOB_TRANSITIONS,
        ev.PreemptionHoldReleased,
        ev.NodeHeartbeatRecorded,
        ev.AttemptCheckpointed,
        ev.InputRejected,
        ev.AttemptFenced,
    }
)
"""Events that change no bound: after only these, only jobs that entered a queue need a look."""


# ----- the rule ----------------------------------------------------------------------------------


def blocked_reason(
    state: ClusterState, environment: ServiceEnvironmentSpec, share: ShareRecord, job: JobRecord
) -> tuple[str, str] | None:
    """(code, ``statusReason``: ``"<CODE> - <sentence>"``) when ``job`` can never run as things are
    (S9.1), else None."""
    found = blocked(state, environment, share, job)
    return None if found is None else (found[0], status_reason(found))


def status_reason(found: Found) -> str:
    """S9.1: ``"<CODE> - Job <needs ... but ...>"``, the text of ``statusReason``."""
    return f"{found[0]} - Job {found[1]}"


def blocked(
    state: ClusterState, environment: ServiceEnvironmentSpec, share: ShareRecord, job: JobRecord
) -> Found | None:
    """The first bound the job's demand exceeds, with its figures and remedy; None if none."""
    plans = plans_could_add(state, environment.name, share.key, job.unit)
    return (
        _over_environment(environment, job, plans[0])
        or _over_share(share, job, plans[1])
        or _over_nodes(state, environment, job, plans[2])
    )


def _over_environment(environment: ServiceEnvironmentSpec, job: JobRecord, planned: int) -> Found | None:
    most = environment_limit(environment, job.unit) + planned
    if job.count <= most:
        return None
    return (
        SERVICE_ENVIRONMENT_MAX_RESOURCE,
        f"needs {job.count} {job.unit} but service environment {environment.name} allows at most {most}",
        f"raise service environment {environment.name}'s maxCapacity for {job.unit} to at least {job.count}",
        most,
    )


def _over_share(share: ShareRecord, job: JobRecord, planned: int) -> Found | None:
    own = share.spec.limit(job.unit)
    most = max_usage(share.spec, None if own is None else own + planned)
    if most is None or job.count <= most:
        return None
    name = share.key[1]
    if share.spec.strategy is LEND_AND_BORROW:
        fix = f"raise quota share {name}'s limit or borrowLimit so that it may hold {job.count} {job.unit}"
    else:
        fix = (
            f"raise quota share {name}'s limit for {job.unit} to at least {job.count} "
            "(or make it LEND_AND_BORROW with a borrowLimit)"
        )
    needs = f"needs {job.count} {job.unit} but quota share {name} may hold at most {most}"
    return QUOTA_MANAGEMENT_LIMIT_EXCEEDED, needs, fix, most


def _over_nodes(
    state: ClusterState, environment: ServiceEnvironmentSpec, job: JobRecord, planned: int
) -> Found | None:
    offered = state.pool_slots.get(environment.pool, {}).get(job.unit, 0) + planned
    if job.count <= offered:
        return None
    return (
        INSUFFICIENT_INSTANCE_CAPACITY,
        f"needs {job.count} {job.unit} but the online nodes of pool {environment.pool} offer {offered}",
        f"bring nodes online (or undrain them) so that pool {environment.pool} offers at least "
        f"{job.count} {job.unit} slots",
        offered,
    )


def unblock_action(found: Found) -> str:
    """What lets a blocked job run: a smaller demand, the code's remedy, or its end."""
    smaller = f"resubmit it needing at most {found[3]}, " if found[3] > 0 else ""
    return f"Terminate it, {smaller}or {found[2]}" if smaller else f"Terminate it or {found[2]}"


def never_runnable(state: ClusterState, job: JobRecord) -> bool:
    """Whether a queued job is blocked (S9.1), wherever it is in its share."""
    environment = state.environment_of_queue(job.share[0])
    return environment is not None and blocked(state, environment, state.shares[job.share], job) is not None


# ----- recording the changes ---------------------------------------------------------------------


def record_blocked(ctx: Context, environment: ServiceEnvironmentSpec, shares: list[ShareRecord]) -> None:
    """Emit the changes of each share's blocked jobs since the last pass (a fixpoint: none twice).

    Every queued job is looked at again only after an input that may have moved a bound; otherwise
    only the head, the jobs that entered a queue and the preemptors that hold victims, so the cost
    stays independent of queue length. (A head that holds victims is never recorded as blocked: once
    a new head passes it, it may be blocked behind, though neither it nor a bound moved.)"""
    state = ctx.state
    rescan = not all(type(event) in _BOUNDS_KEPT for event in ctx.events)
    entered = [] if rescan else [*_entered(ctx.events), *state.holds]
    for share in shares:
        _record_head(ctx, environment, share)
        if rescan:
            suspects: Iterable[str] = [*share.blocked_behind, *(key[2] for key in share.queue)]
        else:
            suspects = [j for j in entered if (job := state.jobs.get(j)) and job.share == share.key]
        for job_id in suspects:
            _record_behind(ctx, environment, share, job_id)


def _entered(events: list[ev.SchedulerEvent]) -> list[str]:
    """Jobs that (re)entered a queue in this input, once each in the order they did (the events
    emitted for them must not depend on a set's order, which varies with ``PYTHONHASHSEED``)."""
    ids: dict[str, None] = {}
    for event in events:
        if isinstance(event, ev.JobAccepted):
            ids[event.job.job_id] = None
        elif isinstance(event, ev.JobRequeued):
            ids[event.job_id] = None
    return list(ids)


def _record_head(ctx: Context, environment: ServiceEnvironmentSpec, share: ShareRecord) -> None:
    state = ctx.state
    head = state.head(share)
    found = None
    if head is not None and head.job_id not in state.holds:
        found = blocked_reason(state, environment, share, head)
    current = share.blocked
    target = None if found is None or head is None else (head.job_id, found[0], found[1])
    if current is not None and (target is None or current[0] != target[0]):
        # The recorded head is no longer a blocked head: blocked behind the new one, or not blocked.
        _record_behind(ctx, environment, share, current[0], was_head=True)
    if target is not None and (current is None or current[:3] != target):
        _emit_blocked(ctx, share, target[0], target[1], target[2])


def _record_behind(
    ctx: Context, environment: ServiceEnvironmentSpec, share: ShareRecord, job_id: str, was_head: bool = False
) -> None:
    """Record whether a job other than the share's head is blocked, if that changed (``was_head``: it
    is recorded as the blocked head, so either record moves)."""
    state = ctx.state
    job = state.jobs.get(job_id)
    queued = job is not None and job.status is RUNNABLE and state.head(share) is not job
    found = blocked_reason(state, environment, share, job) if queued and job is not None else None
    recorded = None if was_head else share.blocked_behind.get(job_id)
    if found is not None and recorded != found:
        _emit_blocked(ctx, share, job_id, found[0], found[1])
    elif found is None and (was_head or recorded is not None):
        ctx.emit(ev.JobUnblocked, job_id=job_id, job_queue=share.key[0], quota_share=share.key[1])


def _emit_blocked(ctx: Context, share: ShareRecord, job_id: str, code: str, reason: str) -> None:
    # A changed code or text of the same job is simply a new JobBlocked (evolve keeps ``since``).
    ctx.emit(
        ev.JobBlocked,
        job_id=job_id,
        job_queue=share.key[0],
        quota_share=share.key[1],
        code=cast(ev.BlockedCode, code),  # one of BLOCKED_CODES
        status_reason=reason,
    )
