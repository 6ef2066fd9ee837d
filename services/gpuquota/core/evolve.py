"""``evolve(state, event)``: apply one recorded fact. The only code that mutates a ``ClusterState``.

Replay is ``for event in log: evolve(state, event)`` from ``ClusterState()``. Handlers never decide
anything: every choice (which slots, which victims, what outcome) is already in the event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from gpuquota.core.hygiene import next_backoff
from gpuquota.core.lifecycle import JOB_SOURCES, check_transition
from gpuquota.core.pool_index import contribute, reindex, withdraw
from gpuquota.core.quota import plan_allocations
from gpuquota.core.state import (
    RUNNABLE,
    RUNNING,
    SCHEDULED,
    STARTING,
    ClusterState,
    Hold,
    JobRecord,
    NodeRecord,
    ShareRecord,
    StopInfo,
)
from gpuquota.wire import events as ev

E = TypeVar("E")
_HANDLERS: dict[type[Any], Callable[[ClusterState, Any], None]] = {}


def _handles(
    event_type: type[E],
) -> Callable[[Callable[[ClusterState, E], None]], Callable[[ClusterState, E], None]]:
    def register(fn: Callable[[ClusterState, E], None]) -> Callable[[ClusterState, E], None]:
        _HANDLERS[event_type] = fn
        return fn

    return register


def evolve(state: ClusterState, event: ev.SchedulerEvent) -> ClusterState:
    """Apply ``event`` to ``state`` (in place: the state is owned by its caller) and return it.

    A job event is checked against the job transition table first (``lifecycle.JOB_TRANSITIONS``)."""
    if type(event) in JOB_SOURCES:
        _check_job_transition(state, event)
    _HANDLERS[type(event)](state, event)
    state.put("applied", state.applied + 1)
    return state


def _check_job_transition(state: ClusterState, event: ev.SchedulerEvent) -> None:
    job_id: str = event.job.job_id if isinstance(event, ev.JobAccepted) else cast(Any, event).job_id
    job = state.jobs.get(job_id)
    check_transition(event, job_id, None if job is None else job.status)


def handled_event_types() -> frozenset[type[Any]]:
    return frozenset(_HANDLERS)


# ----- resources -------------------------------------------------------------------------------


@_handles(ev.InputRejected)
def _rejected(state: ClusterState, event: ev.InputRejected) -> None:
    pass


@_handles(ev.AttemptFenced)
def _fenced(state: ClusterState, event: ev.AttemptFenced) -> None:
    pass


def _put_resource(state: ClusterState, table: dict[str, Any], name: str, spec: Any, status: str) -> None:
    """A resource's new spec (or its removal); every resource change bumps ``config_version``."""
    state.put("config_version", state.config_version + 1)
    if status == "DELETED":
        state.dict_pop(table, name)
    else:
        state.dict_set(table, name, spec)


@_handles(ev.SchedulingPolicyChanged)
def _policy(state: ClusterState, event: ev.SchedulingPolicyChanged) -> None:
    _put_resource(state, state.policies, event.spec.name, event.spec, event.status)


@_handles(ev.ServiceEnvironmentChanged)
def _environment(state: ClusterState, event: ev.ServiceEnvironmentChanged) -> None:
    _put_resource(state, state.environments, event.spec.name, event.spec, event.status)


@_handles(ev.JobQueueChanged)
def _queue(state: ClusterState, event: ev.JobQueueChanged) -> None:
    _put_resource(state, state.queues, event.spec.name, event.spec, event.status)
    if event.status == "DELETING":
        state.set_add(state.queues_deleting, event.spec.name)
    else:
        state.set_discard(state.queues_deleting, event.spec.name)


@_handles(ev.QuotaShareChanged)
def _share(state: ClusterState, event: ev.QuotaShareChanged) -> None:
    state.put("config_version", state.config_version + 1)
    key = (event.spec.job_queue, event.spec.name)
    if event.status == "DELETED":
        state.dict_pop(state.shares, key)
        return
    share = state.shares.get(key)
    if share is None:
        share = ShareRecord(state.journal_cell, event.spec)
        share.plan_extra = plan_allocations(state, key)
        state.dict_set(state.shares, key, share)
        return
    share.put("spec", event.spec)
    if event.status == "DELETING":
        share.put("deleting", True)


@_handles(ev.TrainingPlanChanged)
def _plan(state: ClusterState, event: ev.TrainingPlanChanged) -> None:
    _put_resource(state, state.plans, event.spec.name, event.spec, event.status)
    _plan_limits(state)


@_handles(ev.TrainingPlanWindowOpened)
def _window_opened(state: ClusterState, event: ev.TrainingPlanWindowOpened) -> None:
    _plan_window(state, event.plan, (event.start, event.end))


@_handles(ev.TrainingPlanWindowClosed)
def _window_closed(state: ClusterState, event: ev.TrainingPlanWindowClosed) -> None:
    _plan_window(state, event.plan, None)


def _plan_window(state: ClusterState, plan: str, window: tuple[int, int] | None) -> None:
    """S11: a plan's nodes offer their slots, and its allocations count, only while a window is open."""
    state.put("config_version", state.config_version + 1)
    if window is None:
        state.dict_pop(state.plan_windows, plan)
    else:
        state.dict_set(state.plan_windows, plan, window)
    for node in state.nodes.values():
        if node.training_plan == plan and node.plan_closed is (window is not None):
            withdraw(state, node)
            node.put("plan_closed", window is None)
            contribute(state, node)
    _plan_limits(state)


def _plan_limits(state: ClusterState) -> None:
    for share in state.shares.values():
        extra = plan_allocations(state, share.key)
        if extra != share.plan_extra:
            share.put("plan_extra", extra)


# ----- jobs ------------------------------------------------------------------------------------


def _refresh_head(state: ClusterState, share: ShareRecord, at: int) -> None:
    head = share.queue.first()[2] if share.queue else None
    current = share.head_since
    if head is None:
        if current is not None:
            share.put("head_since", None)
    elif current is None or current[0] != head:
        share.put("head_since", (head, at))


def _enqueue(state: ClusterState, job: JobRecord, at: int) -> None:
    share = state.shares[job.share]
    state.sorted_add(share.queue, job.queue_key)
    _refresh_head(state, share, at)


def _dequeue(state: ClusterState, job: JobRecord, at: int) -> None:
    share = state.shares[job.share]
    state.sorted_discard(share.queue, job.queue_key)
    _refresh_head(state, share, at)


def _release(state: ClusterState, job: JobRecord) -> None:
    """Give back the job's slots and usage (S2.2: only when its node reports it stopped, or is lost)."""
    for placement in job.placements:
        node = state.nodes.get(placement.node_id)
        if node is None:
            continue
        free = node.free[job.unit]
        before = len(free) if node.usable else 0
        for slot in placement.slots:
            state.list_insort(free, slot)
        reindex(state, node, job.unit, before)
        if node.usable:
            state.dict_add(state.child(state.pool_free, node.pool, dict), job.unit, len(placement.slots))
    _drop_victim(state, job)
    share = state.shares[job.share]
    state.dict_add(share.usage, job.unit, -job.count)
    state.dict_add(state.queue_usage, (job.share[0], job.unit), -job.count)
    state.set_discard(state.child(share.dispatched, job.unit, set), job.job_id)
    if job.attempt_duration_seconds is not None and job.started_at is not None:
        deadline = job.started_at + job.attempt_duration_seconds * 1000
        state.sorted_discard(state.deadlines, (deadline, job.job_id, job.attempt_id))
    for hold in state.holds.values():
        state.set_discard(hold.victims, job.job_id)
    job.put("attempt_id", None)
    job.put("placements", ())
    if job.parts_over:
        job.put("parts_over", ())
    job.put("stop", None)
    job.put("started_at", None)


def _add_victim(state: ClusterState, job: JobRecord) -> None:
    share = state.shares[job.share]
    state.list_insort(state.child(share.victims, job.unit, list), job.victim_key)


def _drop_victim(state: ClusterState, job: JobRecord) -> None:
    """The job stops being a preemption candidate (it is stopping, or its attempt is over)."""
    if job.dispatched and job.stop is None:
        state.list_discard(state.shares[job.share].victims[job.unit], job.victim_key)


def _forget(state: ClusterState, job: JobRecord, at: int) -> None:
    """A terminal job leaves the core's state (its history lives in the event log and read model)."""
    if job.dispatched:
        _release(state, job)
    elif job.status is RUNNABLE:
        _dequeue(state, job, at)
        behind = state.shares[job.share].blocked_behind
        if job.job_id in behind:
            state.dict_pop(behind, job.job_id)
    if job.job_id in state.holds:
        state.dict_pop(state.holds, job.job_id)
    state.dict_pop(state.jobs, job.job_id)


@_handles(ev.JobAccepted)
def _accepted(state: ClusterState, event: ev.JobAccepted) -> None:
    job = JobRecord(state.journal_cell, event.job, event.occurred_at)
    state.dict_set(state.jobs, job.job_id, job)
    _enqueue(state, job, event.occurred_at)


@_handles(ev.JobDispatched)
def _dispatched(state: ClusterState, event: ev.JobDispatched) -> None:
    job = state.jobs[event.job_id]
    _dequeue(state, job, event.occurred_at)
    for placement in event.placements:
        node = state.nodes[placement.node_id]
        free = node.free[job.unit]
        before = len(free) if node.usable else 0
        for slot in placement.slots:
            state.list_discard(free, slot)
        reindex(state, node, job.unit, before)
        state.dict_add(state.child(state.pool_free, node.pool, dict), job.unit, -len(placement.slots))
    share = state.shares[job.share]
    state.dict_add(share.usage, job.unit, job.count)
    state.dict_add(state.queue_usage, (job.share[0], job.unit), job.count)
    state.set_add(state.child(share.dispatched, job.unit, set), job.job_id)
    state.put("dispatch_counter", state.dispatch_counter + 1)
    job.put("status", SCHEDULED)
    job.put("status_reason", "")
    job.put("attempt_id", event.attempt_id)
    job.put("attempt_number", event.attempt_number)
    job.put("placements", event.placements)
    job.put("scheduled_at", event.occurred_at)
    job.put("dispatch_seq", state.dispatch_counter)
    _add_victim(state, job)
    if job.job_id in state.holds:
        state.dict_pop(state.holds, job.job_id)


@_handles(ev.JobStarting)
def _starting(state: ClusterState, event: ev.JobStarting) -> None:
    state.jobs[event.job_id].put("status", STARTING)


@_handles(ev.JobRunning)
def _running(state: ClusterState, event: ev.JobRunning) -> None:
    job = state.jobs[event.job_id]
    job.put("status", RUNNING)
    job.put("started_at", event.occurred_at)
    if job.attempt_duration_seconds is not None:
        deadline = event.occurred_at + job.attempt_duration_seconds * 1000
        state.sorted_add(state.deadlines, (deadline, job.job_id, event.attempt_id))


@_handles(ev.JobSucceeded)
def _succeeded(state: ClusterState, event: ev.JobSucceeded) -> None:
    _forget(state, state.jobs[event.job_id], event.occurred_at)


@_handles(ev.JobFailed)
def _failed(state: ClusterState, event: ev.JobFailed) -> None:
    _forget(state, state.jobs[event.job_id], event.occurred_at)


@_handles(ev.JobRequeued)
def _requeued(state: ClusterState, event: ev.JobRequeued) -> None:
    job = state.jobs[event.job_id]
    _release(state, job)
    if event.cause == "RETRY":
        job.put("failures", job.failures + 1)
    elif event.cause == "PREEMPTED":
        job.put("preempted_count", job.preempted_count + 1)
    job.put("status", RUNNABLE)
    job.put("status_reason", event.status_reason)
    job.put("runnable_since", event.occurred_at)
    _enqueue(state, job, event.occurred_at)


@_handles(ev.JobPreempted)
def _preempted(state: ClusterState, event: ev.JobPreempted) -> None:
    victim = state.jobs[event.job_id]
    _drop_victim(state, victim)
    victim.put("stop", StopInfo("PREEMPTED", event.status_reason, event.preemptor_job_id))
    if event.kind == "CROSS_SHARE":
        victim_share = state.shares[victim.share]
        if (backoff := next_backoff(victim_share, event.occurred_at)) is not None:
            victim_share.put("backoff", backoff)
    if event.kind == "TRAINING_PLAN":
        return  # no preemptor to hold capacity for: the plan's window closed (S11)
    hold = state.holds.get(event.preemptor_job_id)
    if hold is None:
        preemptor = state.jobs[event.preemptor_job_id]
        queue = state.queues[preemptor.share[0]]
        hold = Hold(
            preemptor.job_id, queue.service_environment, preemptor.share, preemptor.unit, preemptor.count
        )
        state.dict_set(state.holds, preemptor.job_id, hold)
    state.set_add(hold.victims, victim.job_id)


@_handles(ev.JobStopRequested)
def _stop_requested(state: ClusterState, event: ev.JobStopRequested) -> None:
    job = state.jobs[event.job_id]
    _drop_victim(state, job)
    job.put("stop", StopInfo(event.cause, event.status_reason))


@_handles(ev.AttemptPartEnded)
def _part_ended(state: ClusterState, event: ev.AttemptPartEnded) -> None:
    job = state.jobs[event.job_id]
    job.put("parts_over", (*job.parts_over, (event.node_id, event.status)))


@_handles(ev.AttemptOutputsRecorded)
def _outputs(state: ClusterState, event: ev.AttemptOutputsRecorded) -> None:
    pass  # the read model's: where the attempt's model is does not change scheduling


@_handles(ev.AttemptCheckpointed)
def _checkpointed(state: ClusterState, event: ev.AttemptCheckpointed) -> None:
    state.jobs[event.job_id].put("checkpoint_at", event.checkpoint_at)


@_handles(ev.JobPriorityChanged)
def _priority(state: ClusterState, event: ev.JobPriorityChanged) -> None:
    job = state.jobs[event.job_id]
    if job.status is RUNNABLE:
        _dequeue(state, job, event.occurred_at)
        job.put("priority", event.priority)
        _enqueue(state, job, event.occurred_at)
    else:
        _drop_victim(state, job)
        job.put("priority", event.priority)
        if job.stop is None:
            _add_victim(state, job)


@_handles(ev.JobTagsChanged)
def _tags(state: ClusterState, event: ev.JobTagsChanged) -> None:
    """Tags do not take part in scheduling: only the read model keeps them."""


@_handles(ev.JobBlocked)
def _blocked(state: ClusterState, event: ev.JobBlocked) -> None:
    share = state.shares[(event.job_queue, event.quota_share)]
    current = share.blocked
    head = state.head(share)
    if head is None or head.job_id != event.job_id:
        # S9.1: a blocked job behind the head; no time limit acts on it (S9.2 acts on heads).
        if current is not None and current[0] == event.job_id:
            share.put("blocked", None)
        state.dict_set(share.blocked_behind, event.job_id, (event.code, event.status_reason))
        return
    if event.job_id in share.blocked_behind:
        state.dict_pop(share.blocked_behind, event.job_id)
    # S9.2: a time limit counts from when the job became blocked with this code; new figures in the
    # same code's text do not restart it.
    same = current is not None and current[0] == event.job_id and current[1] == event.code
    since = current[3] if same and current is not None else event.occurred_at
    share.put("blocked", (event.job_id, event.code, event.status_reason, since))


@_handles(ev.JobUnblocked)
def _unblocked(state: ClusterState, event: ev.JobUnblocked) -> None:
    share = state.shares.get((event.job_queue, event.quota_share))
    if share is not None and share.blocked is not None and share.blocked[0] == event.job_id:
        share.put("blocked", None)
    if share is not None and event.job_id in share.blocked_behind:
        state.dict_pop(share.blocked_behind, event.job_id)


@_handles(ev.PreemptionHoldReleased)
def _hold_released(state: ClusterState, event: ev.PreemptionHoldReleased) -> None:
    state.dict_pop(state.holds, event.job_id)


# ----- nodes -----------------------------------------------------------------------------------


@_handles(ev.NodeRegistered)
def _node_registered(state: ClusterState, event: ev.NodeRegistered) -> None:
    old = state.nodes.get(event.node_id)
    if old is not None:
        withdraw(state, old)
    node = NodeRecord(state.journal_cell, event.node_id, event.pool, event.slots, event.occurred_at)
    if old is not None:
        # Attempts still placed on the node keep their slots: decide requeued every attempt whose slots
        # the new list does not offer identically, so the slots still in use are the same (S7.1).
        old_free = {i for free in old.free.values() for i in free}
        used = set(range(len(old.slots))) - old_free
        for free in node.free.values():
            free[:] = [i for i in free if i not in used]
    node.draining = event.draining
    node.training_plan = event.training_plan
    node.plan_closed = event.training_plan is not None and event.training_plan not in state.plan_windows
    node.address = event.address
    node.incarnation = event.incarnation
    state.dict_set(state.nodes, node.node_id, node)
    contribute(state, node)


@_handles(ev.NodeHeartbeatRecorded)
def _heartbeat(state: ClusterState, event: ev.NodeHeartbeatRecorded) -> None:
    state.nodes[event.node_id].put("last_heartbeat", event.occurred_at)


@_handles(ev.NodeDraining)
def _draining(state: ClusterState, event: ev.NodeDraining) -> None:
    node = state.nodes[event.node_id]
    withdraw(state, node)
    node.put("draining", True)


@_handles(ev.NodeUndrained)
def _undrained(state: ClusterState, event: ev.NodeUndrained) -> None:
    node = state.nodes[event.node_id]
    node.put("draining", False)
    contribute(state, node)


@_handles(ev.NodeLossSuspended)
def _loss_suspended(state: ClusterState, event: ev.NodeLossSuspended) -> None:
    state.dict_set(state.loss_suspended, event.pool, event.occurred_at)


@_handles(ev.NodeLossResumed)
def _loss_resumed(state: ClusterState, event: ev.NodeLossResumed) -> None:
    """Every online node of the pool starts a whole heartbeat timeout afresh."""
    state.dict_pop(state.loss_suspended, event.pool)
    for node in state.nodes.values():
        if node.pool == event.pool and node.online:
            node.put("last_heartbeat", event.occurred_at)


@_handles(ev.NodeLost)
def _lost(state: ClusterState, event: ev.NodeLost) -> None:
    node = state.nodes[event.node_id]
    withdraw(state, node)
    node.put("online", False)
