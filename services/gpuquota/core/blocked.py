"""Blocked head jobs (semantics S9.1): the one home of AWS's reasons for a job that cannot run.

A RUNNABLE job that merely waits its turn (behind its share's head, or for capacity its share will
get back) is not blocked. A head job is blocked when, as things are configured or as the nodes are,
it cannot run however long it waits:

- ``MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE``: more than the service environment's limit;
- ``MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED``: more than its share may ever hold, M(s,u);
- ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``: within the limits, but the pool's online, non-draining
  nodes do not offer that many slots of the unit in total.

The scheduling pass records each change of a share's blocked head as ``JobBlocked`` or
``JobUnblocked`` (``record_blocked``), so the reason is in the log, in the read model's
``statusReason``, and drives ``jobStateTimeLimitActions`` (S9.2).
"""

from __future__ import annotations

from typing import Final, cast

from gpuquota.core.context import Context
from gpuquota.core.quota import environment_limit, share_max_usage
from gpuquota.core.state import ClusterState, JobRecord, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire.base import ServiceEnvironmentSpec

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


def blocked_reason(
    state: ClusterState, environment: ServiceEnvironmentSpec, share: ShareRecord, job: JobRecord
) -> tuple[str, str] | None:
    """(code, ``"<CODE> - <sentence>"``) when ``job`` can never run as things are (S9.1), else None."""
    unit, demand = job.unit, job.count
    environment_max = environment_limit(environment, unit)
    if demand > environment_max:
        code = SERVICE_ENVIRONMENT_MAX_RESOURCE
        return code, (
            f"{code} - Job needs {demand} {unit} but service environment {environment.name} "
            f"allows at most {environment_max}"
        )
    share_max = share_max_usage(share, unit)
    if share_max is not None and demand > share_max:
        code = QUOTA_MANAGEMENT_LIMIT_EXCEEDED
        return code, (
            f"{code} - Job needs {demand} {unit} but quota share {share.key[1]} may hold at most {share_max}"
        )
    offered = state.pool_slots.get(environment.pool, {}).get(unit, 0)
    if demand > offered:
        code = INSUFFICIENT_INSTANCE_CAPACITY
        return code, (
            f"{code} - Job needs {demand} {unit} but the online nodes of pool {environment.pool} "
            f"offer {offered}"
        )
    return None


def record_blocked(ctx: Context, environment: ServiceEnvironmentSpec, shares: list[ShareRecord]) -> None:
    """Emit the changes of each share's blocked head since the last pass (a fixpoint: none twice)."""
    state = ctx.state
    for share in shares:
        head = state.head(share)
        found = None
        if head is not None and head.job_id not in state.holds:
            found = blocked_reason(state, environment, share, head)
        current = share.blocked
        target = None if found is None or head is None else (head.job_id, found[0], found[1])
        # A changed code or text of the same job is simply a new JobBlocked (evolve keeps ``since``).
        if current is not None and (target is None or current[0] != target[0]):
            ctx.emit(ev.JobUnblocked, job_id=current[0], job_queue=share.key[0], quota_share=share.key[1])
        if target is not None and (current is None or current[:3] != target):
            ctx.emit(
                ev.JobBlocked,
                job_id=target[0],
                job_queue=share.key[0],
                quota_share=share.key[1],
                code=cast(ev.BlockedCode, target[1]),  # one of BLOCKED_CODES
                status_reason=target[2],
            )
