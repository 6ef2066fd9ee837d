"""What a node's report of an attempt means for its job (S5.4 to S5.7, S5.9): shared by the
``AttemptReport`` handler and by node reconciliation (``gpuquota.core.nodes``)."""

from __future__ import annotations

from typing import Literal, cast

from gpuquota.core import checkpoints
from gpuquota.core.context import Context
from gpuquota.core.lifecycle import REPORT_TRANSITIONS, algorithm_error, retry_allowed
from gpuquota.core.lost_tail import finished_elsewhere
from gpuquota.core.state import ClusterState, JobRecord, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.inputs import SchedulerInput

FinalReport = Literal["SUCCEEDED", "FAILED", "STOPPED"]


def reject(
    ctx: Context, message: SchedulerInput, reason: str, job_id: str | None = None, node_id: str | None = None
) -> bool:
    ctx.emit(
        ev.InputRejected,
        input_event_id=message.event_id,
        input_type=message.type,
        reason=reason,
        job_id=job_id,
        node_id=node_id,
    )
    return False


def finish_share_deletion(ctx: Context, share: ShareRecord) -> None:
    """A deleting share with no job left is DELETED; so is its queue, when it is being deleted and this
    was its last share."""
    state = ctx.state
    if share.deleting and not share.queue and not any(share.dispatched.values()):
        ctx.emit(ev.QuotaShareChanged, spec=share.spec, status="DELETED")
        name = share.key[0]
        if name in state.queues_deleting and not state.shares_of_queue(name):
            ctx.emit(ev.JobQueueChanged, spec=state.queues[name], status="DELETED")


def requeue(ctx: Context, job: JobRecord, cause: ev.RequeueCause, reason: str) -> None:
    """The dispatched job's attempt ends and the job is RUNNABLE again."""
    assert job.attempt_id is not None  # dispatched
    ctx.emit(ev.JobRequeued, job_id=job.job_id, attempt_id=job.attempt_id, cause=cause, status_reason=reason)


def request_stop(ctx: Context, job: JobRecord, cause: ev.StopCause, reason: str) -> None:
    """The node agents must stop the dispatched job's attempt; ``stopped`` decides once it is gone."""
    assert job.attempt_id is not None  # dispatched
    ctx.emit(
        ev.JobStopRequested, job_id=job.job_id, attempt_id=job.attempt_id, cause=cause, status_reason=reason
    )


def fail_terminated(ctx: Context, job: JobRecord, reason: str) -> None:
    """The job FAILED as terminated: a queued one at once, a dispatched one once its attempt is gone."""
    ctx.emit(
        ev.JobFailed, job_id=job.job_id, attempt_id=job.attempt_id, status_reason=reason, is_terminated=True
    )


def jobs_on_node(state: ClusterState, node_id: str) -> list[JobRecord]:
    """The dispatched jobs with a placement on the node, by job id."""
    return sorted(
        (
            job
            for share in state.shares.values()
            for ids in share.dispatched.values()
            for job in (state.jobs[i] for i in ids)
            if any(p.node_id == node_id for p in job.placements)
        ),
        key=lambda j: j.job_id,
    )


def attempt_failed(ctx: Context, job: JobRecord, reason: str) -> None:
    """S5.4: retry while attempts remain and ``evaluateOnExit`` says RETRY; otherwise FAILED."""
    assert job.attempt_id is not None
    if job.failures + 1 < job.retry_attempts and retry_allowed(job.evaluate_on_exit, reason):
        requeue(ctx, job, "RETRY", reason)
    else:
        ctx.emit(ev.JobFailed, job_id=job.job_id, attempt_id=job.attempt_id, status_reason=reason)


def stopped(ctx: Context, job: JobRecord, node_id: str) -> None:
    """The attempt is gone: the outcome depends on why it was being stopped (S4.4, S5.5, S5.6, S5.9)."""
    attempt_id = job.attempt_id
    assert attempt_id is not None
    stop = job.stop
    if stop is None:
        requeue(ctx, job, "HANDED_BACK", f"Attempt {attempt_id} was handed back by node {node_id}")
    elif stop.cause == "PREEMPTED":
        retries = job.preemption_retries
        if retries is not None and job.preempted_count + 1 > retries:
            reason = f"{stop.reason}; preemption retries exhausted ({retries})"
            ctx.emit(
                ev.JobFailed, job_id=job.job_id, attempt_id=attempt_id, status_reason=reason, preempted=True
            )
        else:
            requeue(ctx, job, "PREEMPTED", stop.reason)
    elif stop.cause in ("TIMEOUT", "INSTANCE_FAILED"):
        attempt_failed(ctx, job, stop.reason)
    else:
        fail_terminated(ctx, job, stop.reason)


def failure_reason(m: inp.AttemptReport) -> str:
    if m.status_reason:
        return m.status_reason
    if m.exit_code is not None:
        return algorithm_error(f"exited with code {m.exit_code}")
    return "Attempt failed"


def part_ended_early(ctx: Context, job: JobRecord, m: inp.AttemptReport) -> bool:
    """I6: an attempt placed on several nodes ends once, when its last part has ended (True: this one
    was not the last). The first part that ends otherwise than SUCCEEDED
    stops the others; the attempt then fails with that part's reason (unless a stop was already on
    its way: that stop's cause decides)."""
    over = {node for node, _ in job.parts_over}
    if not {p.node_id for p in job.placements} - over - {m.node_id}:
        return False
    attempt_id = job.attempt_id
    assert attempt_id is not None
    status = cast(FinalReport, m.status)  # its STARTING and RUNNING reports never get here
    ctx.emit(
        ev.AttemptPartEnded,
        job_id=job.job_id,
        attempt_id=attempt_id,
        node_id=m.node_id,
        status=status,
        status_reason=m.status_reason,
    )
    if status != "SUCCEEDED" and job.stop is None:
        reason = failure_reason(m)
        if status == "STOPPED":
            reason = m.status_reason or f"Attempt {attempt_id} was handed back by node {m.node_id}"
        request_stop(ctx, job, "INSTANCE_FAILED", reason)
    return True


def adopt_success(ctx: Context, job: JobRecord, attempt_id: str) -> bool:
    """A node ran ``attempt_id`` to success, which the log lost (``core.lost_tail``): adopt it, so
    the job does not run again. Its current attempt, if the shorter log dispatched it again, is
    fenced on every node it was placed on (a ``StopAttempt`` now, not at that node's next heartbeat)
    and released with the job. True: capacity may have been freed."""
    share = ctx.state.shares[job.share]
    if job.attempt_id is not None:
        reason = f"Attempt {attempt_id} of the job already succeeded (a log that lost its end)"
        for node_id in sorted({p.node_id for p in job.placements}):
            ctx.emit(
                ev.AttemptFenced, node_id=node_id, job_id=job.job_id, attempt_id=job.attempt_id, reason=reason
            )
    ctx.emit(ev.JobSucceeded, job_id=job.job_id, attempt_id=attempt_id)
    finish_share_deletion(ctx, share)
    return True


def apply_report(ctx: Context, m: inp.AttemptReport) -> bool:
    state = ctx.state
    job = state.jobs.get(m.job_id)
    if finished_elsewhere(job, m.node_id, m.attempt_id, m.status):
        assert job is not None
        return adopt_success(ctx, job, m.attempt_id)
    if job is None or job.attempt_id != m.attempt_id:
        if m.status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return False  # a late report of an attempt that is already over: nothing to do
        ctx.emit(
            ev.AttemptFenced,
            node_id=m.node_id,
            job_id=m.job_id,
            attempt_id=m.attempt_id,
            reason="The scheduler does not assign this attempt to the node",
        )
        return False
    if m.node_id not in {p.node_id for p in job.placements}:
        return reject(ctx, m, f"Attempt {m.attempt_id} is not placed on node {m.node_id}", job_id=m.job_id)
    checkpoints.record(ctx, m.node_id, m.job_id, m.attempt_id, m.checkpoint_at)  # S12
    meaning = REPORT_TRANSITIONS.get(job.status, {}).get(m.status)
    if meaning is None:
        return reject(
            ctx, m, f"Illegal transition: job {job.job_id} is {job.status} and cannot be {m.status}"
        )
    if meaning != "apply":
        return False
    share = state.shares[job.share]
    if m.status == "STARTING":
        ctx.emit(ev.JobStarting, job_id=job.job_id, attempt_id=m.attempt_id)
        return False
    if m.status == "RUNNING":
        ctx.emit(ev.JobRunning, job_id=job.job_id, attempt_id=m.attempt_id)
        return False
    if any(node == m.node_id for node, _ in job.parts_over):
        return False  # a repeated report of a part already recorded
    if m.outputs:
        ctx.emit(
            ev.AttemptOutputsRecorded,
            job_id=job.job_id,
            attempt_id=m.attempt_id,
            node_id=m.node_id,
            outputs=m.outputs,
        )
    if part_ended_early(ctx, job, m):
        return False
    if m.status == "SUCCEEDED" and all(status == "SUCCEEDED" for _, status in job.parts_over):
        ctx.emit(ev.JobSucceeded, job_id=job.job_id, attempt_id=m.attempt_id)
    elif job.stop is not None:
        stopped(ctx, job, m.node_id)
    elif m.status == "FAILED":
        attempt_failed(ctx, job, failure_reason(m))
    else:
        stopped(ctx, job, m.node_id)
    finish_share_deletion(ctx, share)
    return True
