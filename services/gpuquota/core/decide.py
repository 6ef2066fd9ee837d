"""``decide(state, input) -> events``: the one entry point of the scheduling core.

Theory of operation
-------------------
``decide`` is pure: it opens a trial on the state, handles the input, runs the scheduling pass, and
rolls the trial back, returning only the events. Each event is applied as soon as it is emitted, so
the pass sees the input's effect (a new job, freed capacity) and every later decision sees earlier
ones; replaying the returned events with ``evolve`` reproduces exactly the state the trial reached.

Handlers validate first: a bad input (unknown share, disabled queue, a report for an attempt the
node does not hold) yields ``InputRejected`` or ``AttemptFenced``, never an exception. Time comes
only from ``input.occurred_at``; ids derive from ``input.event_id``.

After handling, the pass (``schedule``) runs, except after inputs that provably cannot change a
decision (a queued job that does not become its share's head, a heartbeat): the pass is a fixpoint, so
skipping it there is exact, and it keeps the cost per input independent of queue length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuquota.core import checkpoints, nodes, plans
from gpuquota.core.blocked import TIME_LIMIT_REASON, never_runnable
from gpuquota.core.context import Context, EventHook
from gpuquota.core.hygiene import tag_problem, timed_units
from gpuquota.core.outcomes import apply_report, fail_terminated, finish_share_deletion, reject, request_stop
from gpuquota.core.quota import share_limit
from gpuquota.core.schedule import schedule
from gpuquota.core.state import ClusterState, JobRecord, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobQueueSpec, JobStatus, QuotaShareSpec, State
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput

MAX_SHARES_PER_QUEUE = 20
Handler = Callable[[Context, Any], bool]
_HANDLERS: dict[type[Any], Handler] = {}


def decide(state: ClusterState, message: SchedulerInput) -> list[SchedulerEvent]:
    """The events that follow from ``message``; ``state`` is left unchanged."""
    with state.trial():
        ctx = Context(state, message.event_id, message.occurred_at)
        if _HANDLERS[type(message)](ctx, message) and ctx.dirty != set():
            schedule(ctx)
        return ctx.events


def step(
    state: ClusterState, message: SchedulerInput, before: EventHook | None = None
) -> list[SchedulerEvent]:
    """``decide`` and ``evolve`` in one go: the returned events are already applied to ``state``.

    For shells that can rebuild their state from the log whenever persisting the events fails (the
    state is then ahead of the log). Equivalent to ``decide`` followed by ``evolve`` of each event,
    without the trial's journal and the second application. ``before(state, event)``, if given, is
    called just before each event is applied, as a shell would between ``decide`` and each ``evolve``
    (to derive what the event means for the state it is about to change, e.g. node commands).
    """
    ctx = Context(state, message.event_id, message.occurred_at, before)
    if _HANDLERS[type(message)](ctx, message) and ctx.dirty != set():
        schedule(ctx)
    return ctx.events


def handled_input_types() -> frozenset[type[Any]]:
    return frozenset(_HANDLERS)


def _handles(input_type: type[Any]) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _HANDLERS[input_type] = fn
        return fn

    return register


# ----- resources -------------------------------------------------------------------------------


@_handles(inp.CreateSchedulingPolicy)
def _create_policy(ctx: Context, m: inp.CreateSchedulingPolicy) -> bool:
    if m.spec.name in ctx.state.policies:
        return reject(ctx, m, f"Scheduling policy {m.spec.name} already exists")
    ctx.emit(ev.SchedulingPolicyChanged, spec=m.spec)
    return False


@_handles(inp.UpdateSchedulingPolicy)
def _update_policy(ctx: Context, m: inp.UpdateSchedulingPolicy) -> bool:
    if m.spec.name not in ctx.state.policies:
        return reject(ctx, m, f"Scheduling policy {m.spec.name} does not exist")
    ctx.emit(ev.SchedulingPolicyChanged, spec=m.spec)
    return True


@_handles(inp.DeleteSchedulingPolicy)
def _delete_policy(ctx: Context, m: inp.DeleteSchedulingPolicy) -> bool:
    spec = ctx.state.policies.get(m.name)
    if spec is None:
        return reject(ctx, m, f"Scheduling policy {m.name} does not exist")
    users = sorted(q.name for q in ctx.state.queues.values() if q.scheduling_policy == m.name)
    if users:
        return reject(ctx, m, f"Scheduling policy {m.name} is used by job queue {users[0]}")
    ctx.emit(ev.SchedulingPolicyChanged, spec=spec, status="DELETED")
    return False


@_handles(inp.CreateServiceEnvironment)
def _create_environment(ctx: Context, m: inp.CreateServiceEnvironment) -> bool:
    if m.spec.name in ctx.state.environments:
        return reject(ctx, m, f"Service environment {m.spec.name} already exists")
    ctx.emit(ev.ServiceEnvironmentChanged, spec=m.spec)
    return False


@_handles(inp.UpdateServiceEnvironment)
def _update_environment(ctx: Context, m: inp.UpdateServiceEnvironment) -> bool:
    old = ctx.state.environments.get(m.spec.name)
    if old is None:
        return reject(ctx, m, f"Service environment {m.spec.name} does not exist")
    if old.pool != m.spec.pool:
        return reject(ctx, m, "The pool of a service environment cannot be changed")
    ctx.emit(ev.ServiceEnvironmentChanged, spec=m.spec)
    return True


@_handles(inp.DeleteServiceEnvironment)
def _delete_environment(ctx: Context, m: inp.DeleteServiceEnvironment) -> bool:
    spec = ctx.state.environments.get(m.name)
    if spec is None:
        return reject(ctx, m, f"Service environment {m.name} does not exist")
    if spec.state is not State.DISABLED:
        return reject(ctx, m, f"Service environment {m.name} must be DISABLED before it is deleted")
    users = sorted(q.name for q in ctx.state.queues.values() if q.service_environment == m.name)
    if users:
        return reject(ctx, m, f"Service environment {m.name} is attached to job queue {users[0]}")
    ctx.emit(ev.ServiceEnvironmentChanged, spec=spec, status="DELETED")
    return False


@_handles(inp.CreateJobQueue)
def _create_queue(ctx: Context, m: inp.CreateJobQueue) -> bool:
    state, spec = ctx.state, m.spec
    if spec.name in state.queues:
        return reject(ctx, m, f"Job queue {spec.name} already exists")
    if spec.service_environment not in state.environments:
        return reject(ctx, m, f"Service environment {spec.service_environment} does not exist")
    if spec.scheduling_policy not in state.policies:
        return reject(ctx, m, f"Scheduling policy {spec.scheduling_policy} does not exist")
    taken = [q.name for q in state.queues.values() if q.service_environment == spec.service_environment]
    if taken:
        return reject(
            ctx, m, f"Service environment {spec.service_environment} is already used by job queue {taken[0]}"
        )
    ctx.emit(ev.JobQueueChanged, spec=spec)
    return False


@_handles(inp.UpdateJobQueue)
def _update_queue(ctx: Context, m: inp.UpdateJobQueue) -> bool:
    state, spec = ctx.state, m.spec
    old = state.queues.get(spec.name)
    if old is None or spec.name in state.queues_deleting:
        return reject(ctx, m, f"Job queue {spec.name} does not exist")
    if (problem := _environment_change_problem(state, old, spec)) is not None:
        return reject(ctx, m, problem)
    if spec.scheduling_policy not in state.policies:
        return reject(ctx, m, f"Scheduling policy {spec.scheduling_policy} does not exist")
    ctx.emit(ev.JobQueueChanged, spec=spec)
    return True


def _environment_change_problem(state: ClusterState, old: JobQueueSpec, new: JobQueueSpec) -> str | None:
    """A queue may move to another service environment (AWS allows it) that no other queue uses;
    across pools only while none of its jobs holds slots (they hold them in the old pool)."""
    if new.service_environment == old.service_environment:
        return None
    target = state.environments.get(new.service_environment)
    if target is None:
        return f"Service environment {new.service_environment} does not exist"
    taken = [q.name for q in state.queues.values() if q.service_environment == target.name]
    if taken:
        return f"Service environment {target.name} is already used by job queue {taken[0]}"
    source = state.environments.get(old.service_environment)
    holding = any(ids for share in state.shares_of_queue(old.name) for ids in share.dispatched.values())
    if holding and (source is None or source.pool != target.pool):
        return f"Job queue {old.name} has dispatched jobs in pool {source.pool if source else '?'}"
    return None


@_handles(inp.DeleteJobQueue)
def _delete_queue(ctx: Context, m: inp.DeleteJobQueue) -> bool:
    """AWS asks only that the queue be DISABLED and terminates its jobs. gpuquota deletes the queue's
    quota shares with it (S5.9, whatever their state); the queue is DELETED once they are gone."""
    state = ctx.state
    spec = state.queues.get(m.name)
    if spec is None or m.name in state.queues_deleting:
        return reject(ctx, m, f"Job queue {m.name} does not exist")
    if spec.state is not State.DISABLED:
        return reject(ctx, m, f"Job queue {m.name} must be DISABLED before it is deleted")
    shares = sorted(state.shares_of_queue(m.name), key=lambda s: s.key)
    if not shares:
        ctx.emit(ev.JobQueueChanged, spec=spec, status="DELETED")
        return False
    ctx.emit(ev.JobQueueChanged, spec=spec, status="DELETING")
    for share in shares:
        if not share.deleting:
            _start_share_deletion(ctx, share, f"Job queue {m.name} deleted")
        finish_share_deletion(ctx, share)
    return True


def _share_problem(ctx: Context, spec: QuotaShareSpec) -> str | None:
    if spec.job_queue not in ctx.state.queues or spec.job_queue in ctx.state.queues_deleting:
        return f"Job queue {spec.job_queue} does not exist"
    return tag_problem(spec.tags) or checkpoints.tag_problem(spec.tags) or plans.tag_problem(spec.tags)


@_handles(inp.CreateQuotaShare)
def _create_share(ctx: Context, m: inp.CreateQuotaShare) -> bool:
    spec = m.spec
    if (spec.job_queue, spec.name) in ctx.state.shares:
        return reject(ctx, m, f"Quota share {spec.name} already exists in job queue {spec.job_queue}")
    if (problem := _share_problem(ctx, spec)) is not None:
        return reject(ctx, m, problem)
    if len(ctx.state.shares_of_queue(spec.job_queue)) >= MAX_SHARES_PER_QUEUE:
        return reject(ctx, m, f"Job queue {spec.job_queue} already has {MAX_SHARES_PER_QUEUE} quota shares")
    ctx.emit(ev.QuotaShareChanged, spec=spec)
    return True


@_handles(inp.UpdateQuotaShare)
def _update_share(ctx: Context, m: inp.UpdateQuotaShare) -> bool:
    share = ctx.state.shares.get((m.spec.job_queue, m.spec.name))
    if share is None or share.deleting:
        return reject(ctx, m, f"Quota share {m.spec.name} does not exist in job queue {m.spec.job_queue}")
    if (problem := _share_problem(ctx, m.spec)) is not None:
        return reject(ctx, m, problem)
    ctx.emit(ev.QuotaShareChanged, spec=m.spec)
    return True


@_handles(inp.DeleteQuotaShare)
def _delete_share(ctx: Context, m: inp.DeleteQuotaShare) -> bool:
    state = ctx.state
    share = state.shares.get((m.job_queue, m.name))
    if share is None or share.deleting:
        return reject(ctx, m, f"Quota share {m.name} does not exist in job queue {m.job_queue}")
    if share.spec.state is not State.DISABLED:
        return reject(ctx, m, f"Quota share {m.name} must be DISABLED before it is deleted")
    _start_share_deletion(ctx, share, f"Quota share {m.name} deleted")
    finish_share_deletion(ctx, share)
    return True


def _start_share_deletion(ctx: Context, share: ShareRecord, reason: str) -> None:
    """S5.9: the share takes no more jobs; its queued jobs fail, its dispatched ones are stopped."""
    state = ctx.state
    ctx.emit(ev.QuotaShareChanged, spec=share.spec, status="DELETING")
    for job in sorted(_jobs_of_share(state, share), key=lambda j: j.job_id):
        if job.dispatched:
            if job.stop is None or job.stop.cause != "TERMINATED":
                request_stop(ctx, job, "SHARE_DELETED", reason)
        else:
            fail_terminated(ctx, job, reason)


def _jobs_of_share(state: ClusterState, share: ShareRecord) -> list[JobRecord]:
    queued = [state.jobs[key[2]] for key in share.queue]
    dispatched = [state.jobs[job_id] for ids in share.dispatched.values() for job_id in ids]
    return queued + dispatched


_handles(inp.PutTrainingPlan)(plans.put)
_handles(inp.DeleteTrainingPlan)(plans.delete)


# ----- jobs ------------------------------------------------------------------------------------


def _submission_problem(state: ClusterState, m: inp.SubmitJob) -> str | None:
    job = m.job
    if job.job_id in state.jobs:
        return f"Job {job.job_id} already exists"
    queue = state.queues.get(job.job_queue)
    if queue is None:
        return f"Job queue {job.job_queue} does not exist"
    if queue.state is not State.ENABLED:
        return f"Job queue {job.job_queue} is DISABLED"
    share = state.shares.get((job.job_queue, job.quota_share))
    if share is None or share.deleting:
        return f"Quota share {job.quota_share} does not exist in job queue {job.job_queue}"
    if share.spec.state is not State.ENABLED:
        return f"Quota share {job.quota_share} is DISABLED"
    if share_limit(share, job.unit) == 0:
        return f"Quota share {job.quota_share} has no capacity limit for instance type {job.unit}"
    return None


def _retried_submission(state: ClusterState, m: inp.SubmitJob) -> bool:
    """A submission retried with its ``clientToken`` whose first try made the job already: the
    gateway derives a tokened job's id from the pool and the token (``gateway.edge.token_job_id``),
    so a retry names the same job even when the gateway that took the first try is gone."""
    return m.job.client_token is not None and m.job.job_id in state.jobs


@_handles(inp.SubmitJob)
def _submit(ctx: Context, m: inp.SubmitJob) -> bool:
    state = ctx.state
    if _retried_submission(state, m):
        return False  # the job the first try made is the answer: nothing to decide
    if (problem := _submission_problem(state, m)) is not None:
        return reject(ctx, m, problem, job_id=m.job.job_id)
    ctx.emit(ev.JobAccepted, job=m.job)
    job = state.jobs[m.job.job_id]
    if _is_head(state, job) or _backfill_on(ctx, m.job.job_queue):
        return True
    if not never_runnable(state, job):
        return False
    if ctx.dirty is not None:
        ctx.dirty.add(job.unit)  # the pass records it as blocked wherever it waits (S9.1)
    return True


def _is_head(state: ClusterState, job: JobRecord) -> bool:
    return state.head(state.shares[job.share]) is job


def _backfill_on(ctx: Context, queue_name: str) -> bool:
    """With backfill, any queued job may run, not only heads: revisit every unit then."""
    state = ctx.state
    queue = state.queues.get(queue_name)
    policy = None if queue is None else state.policies.get(queue.scheduling_policy)
    if policy is None or not policy.backfill:
        return False
    ctx.touch_all()
    return True


@_handles(inp.UpdateJobPriority)
def _update_priority(ctx: Context, m: inp.UpdateJobPriority) -> bool:
    state = ctx.state
    job = state.jobs.get(m.job_id)
    if job is None:
        return reject(ctx, m, f"Job {m.job_id} does not exist or has finished", job_id=m.job_id)
    was_head = job.status is JobStatus.RUNNABLE and _is_head(state, job)
    ctx.emit(ev.JobPriorityChanged, job_id=job.job_id, priority=m.priority)
    if job.status is not JobStatus.RUNNABLE:
        return True  # S4.6: a dispatched job's new priority matters when it is considered as a victim
    return was_head or _is_head(state, job) or _backfill_on(ctx, job.share[0])


@_handles(inp.TerminateJob)
def _terminate(ctx: Context, m: inp.TerminateJob) -> bool:
    job = ctx.state.jobs.get(m.job_id)
    if job is None:
        return reject(ctx, m, f"Job {m.job_id} does not exist or has finished", job_id=m.job_id)
    if not job.dispatched:
        fail_terminated(ctx, job, m.reason)
        return True
    if job.stop is not None and job.stop.cause == "TERMINATED":
        return False
    request_stop(ctx, job, "TERMINATED", m.reason)
    # A stopping job leaves the victim lists, and S4.1's search walks what remains: a head that
    # found no victims with it there may find some now (found by the S3.3 fixpoint property test).
    return True


@_handles(inp.TagJob)
def _tag_job(ctx: Context, m: inp.TagJob) -> bool:
    # the gateway checked that the job exists; a finished job has left the core's state, not the log
    ctx.emit(ev.JobTagsChanged, job_id=m.job_id, tags=m.tags)
    return False


# ----- nodes and time --------------------------------------------------------------------------


_handles(inp.AttemptReport)(apply_report)
_handles(inp.RegisterNode)(nodes.register)
_handles(inp.NodeHeartbeat)(nodes.heartbeat)
_handles(inp.DrainNode)(nodes.drain)
_handles(inp.UndrainNode)(nodes.undrain)
_handles(inp.DeregisterNode)(nodes.deregister)


@_handles(inp.Tick)
def _tick(ctx: Context, m: inp.Tick) -> bool:
    state, now = ctx.state, m.occurred_at
    nodes.expire_nodes(ctx, now)
    plans.advance(ctx)  # S11: windows open and close with time
    for deadline, job_id, attempt_id in list(state.deadlines.until((now, "\uffff", "\uffff"))):
        job = state.jobs.get(job_id)
        if job is not None and job.attempt_id == attempt_id and job.stop is None and deadline <= now:
            ctx.emit(
                ev.JobStopRequested,
                job_id=job_id,
                attempt_id=attempt_id,
                cause="TIMEOUT",
                status_reason="Attempt duration exceeded",
            )
    _time_limits(ctx, now)
    if ctx.dirty is not None:
        ctx.dirty.update(timed_units(state))  # S10: protections and backoffs end with time
    return True


def _time_limits(ctx: Context, now: int) -> None:
    """S9.2: a head job blocked with an action's reason for its ``maxTimeSeconds`` fails."""
    state = ctx.state
    for share in list(state.shares.values()):
        blocked = share.blocked
        if blocked is None:
            continue
        queue = state.queues.get(share.key[0])
        job_id, code, _, since = blocked
        head = state.head(share)
        if queue is None or head is None or head.job_id != job_id:
            continue
        limits = [a.max_time_seconds for a in queue.time_limit_actions if a.reason == code]
        if limits and now - since >= min(limits) * 1000:
            reason = TIME_LIMIT_REASON.format(code=code)
            fail_terminated(ctx, head, reason)
