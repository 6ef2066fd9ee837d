"""Nodes: registration, heartbeats, draining, loss, and reconciliation with what a node really runs.

Reconciliation (docs/semantics.md, "Nodes and restarts"): a node agent's ``RegisterNode`` and each
``NodeHeartbeat`` list every attempt it knows (``NodeAttempt``: running, or over with its final status
not yet acknowledged). The log is the truth about what the scheduler *assigned*; the node is the truth
about what *runs*. The core reconciles the two:

1. On registration, an attempt the log assigns to the node: the node's status of it is applied as if
   its ``AttemptReport`` had arrived (the report that a crash swallowed: its outcome, if it ended).
   Heartbeats apply nothing: they bypass the agent's ordered outbox, so the reports they would
   overtake follow them (a late STARTING would be fenced).
2. An attempt the node runs, which the log does not assign to it: fenced (``AttemptFenced``, which the
   shells turn into a ``StopAttempt``).
3. An attempt the log assigns to the node, which the node does not report: lost, requeued as by S5.7
   (``NODE_LOST``: no retry or preemption is counted; a stopping attempt takes its stop outcome). On a
   heartbeat this applies only to attempts the node has already reported STARTING or RUNNING: a
   heartbeat may leave before a ``RunAttempt`` reaches the agent, never before the agent's own report.
4. On registration only, an attempt whose slots the new slot list no longer offers identically (a GPU
   removed, a different instance type) is requeued and fenced, so a node that comes back different is
   accepted with exactly the attempts that still fit.

Inputs without ``attempts`` (older agents and logs) skip steps 1 to 3.

A log that lost its end (``core.lost_tail``): an attempt a node lists as SUCCEEDED which the log
never dispatched, or dispatched again to other nodes, is adopted (the job SUCCEEDED), in steps 1 and 2
and for an ``AttemptReport`` alike: a job that finished is not run again.

Incarnations: each ``RegisterNode`` carries a fresh random ``incarnation``, recorded on the node, and
every ``RunAttempt`` carries the incarnation of the registration it was dispatched to. The agent
drops a ``RunAttempt`` addressed to an earlier registration than its own: step 3 of that newer
registration has already requeued the attempt, since the agent did not list it. So an attempt the
scheduler requeued because its node did not report it is known never to start there (a restarted
agent whose command feed resumes at its last committed offset would otherwise run it as well).

Full disruption (as Kubernetes' node controller): node loss means one node stopped reporting while its
pool's other nodes still do. When *every* online node of a pool is silent at once, it is the path from
the nodes to the scheduler that failed (the broker, the scheduler's own link), not the nodes: losing
them would requeue every running attempt while their processes run on. ``expire_nodes`` then declares
no node of the pool lost (``NodeLossSuspended``) until one of them is heard from again: the first tick
after a heartbeat or registration made since the suspension began restarts every node's timer of the
pool at the tick's time (``NodeLossResumed``), so each gets a whole timeout to report before it can be
lost. Ticks carry the scheduler's clock, heartbeats the agents': a heartbeat made during the outage
and delivered late would restart the timers in the past (and suspend the pool again at once), and one
made before the suspension proves nothing about the link now.
"""

from __future__ import annotations

from gpuquota.core import checkpoints
from gpuquota.core.context import Context
from gpuquota.core.lost_tail import finished_elsewhere
from gpuquota.core.outcomes import (
    adopt_success,
    apply_report,
    finish_share_deletion,
    jobs_on_node,
    reject,
    requeue,
    stopped,
)
from gpuquota.core.state import ClusterState, JobRecord
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import NodeAttempt

_OVER = ("SUCCEEDED", "FAILED", "STOPPED")
_REPORTED = ("STARTING", "RUNNING")


def register(ctx: Context, m: inp.RegisterNode) -> bool:
    if m.attempts is not None:
        _reconcile(ctx, m, m.attempts, registration=True)
    for job in jobs_on_node(ctx.state, m.node_id):
        if not _slots_kept(ctx.state, job, m.node_id, m.slots):
            reason = f"Node {m.node_id} registered again without the slots of attempt {job.attempt_id}"
            _fence(ctx, job, m.node_id, reason)
            _lose_attempt(ctx, job, m.node_id, reason)
    # An operator's drain outlives the agent's restart; a lost node that comes back starts afresh.
    old = ctx.state.nodes.get(m.node_id)
    draining = old is not None and old.online and old.draining
    ctx.emit(
        ev.NodeRegistered,
        node_id=m.node_id,
        pool=m.pool,
        slots=m.slots,
        draining=draining,
        address=m.address,
        incarnation=m.incarnation,
        training_plan=m.training_plan,
    )
    return True


def _slots_kept(state: ClusterState, job: JobRecord, node_id: str, slots: tuple[SlotOffer, ...]) -> bool:
    """Every slot the job holds on the node is in the new slot list, at the same index, unchanged."""
    old = state.nodes[node_id].slots
    held = [i for p in job.placements if p.node_id == node_id for i in p.slots]
    return all(i < len(slots) and i < len(old) and slots[i] == old[i] for i in held)


def heartbeat(ctx: Context, m: inp.NodeHeartbeat) -> bool:
    node = ctx.state.nodes.get(m.node_id)
    if node is None or not node.online:
        # the shells answer with a RegisterAgain node command (``gpuquota.scheduler.commands``)
        return reject(ctx, m, f"Node {m.node_id} is not registered; register it again", node_id=m.node_id)
    changed = False
    if m.attempts is not None:
        changed = _reconcile(ctx, m, m.attempts, registration=False)
        for attempt in m.attempts:  # S12: the checkpoints the node has seen
            checkpoints.record(ctx, m.node_id, attempt.job_id, attempt.attempt_id, attempt.checkpoint_at)
    # Record heartbeats coarsely: the log needs only enough of them to decide node loss exactly.
    if m.occurred_at - node.last_heartbeat >= heartbeat_granularity(ctx.state):
        ctx.emit(ev.NodeHeartbeatRecorded, node_id=m.node_id)
    return changed


def _reconcile(
    ctx: Context,
    m: inp.RegisterNode | inp.NodeHeartbeat,
    attempts: tuple[NodeAttempt, ...],
    *,
    registration: bool,
) -> bool:
    """Steps 1 to 3 of the module doc; True when a job's attempt ended (capacity was freed)."""
    state, node_id = ctx.state, m.node_id
    changed = False
    for attempt in attempts:
        job = state.jobs.get(attempt.job_id)
        assigned = job is not None and job.attempt_id == attempt.attempt_id and _placed_on(job, node_id)
        if assigned:
            if registration:
                changed |= apply_report(ctx, _as_report(m, attempt)) and attempt.status in _OVER
        elif finished_elsewhere(job, node_id, attempt.attempt_id, attempt.status):
            assert job is not None
            changed |= adopt_success(ctx, job, attempt.attempt_id)  # the log lost it: core.lost_tail
        elif attempt.status not in _OVER:
            ctx.emit(
                ev.AttemptFenced,
                node_id=node_id,
                job_id=attempt.job_id,
                attempt_id=attempt.attempt_id,
                reason="The scheduler does not assign this attempt to the node",
            )
    known = {a.attempt_id for a in attempts}
    for job in jobs_on_node(state, node_id):
        if job.attempt_id in known or not (registration or job.status.value in _REPORTED):
            continue
        if any(node == node_id for node, _ in job.parts_over):
            continue  # its part ended and was reported; the agent forgot it (other parts still run)
        _lose_attempt(ctx, job, node_id, f"Attempt {job.attempt_id} lost: node {node_id} does not run it")
        changed = True
    return changed


def _placed_on(job: JobRecord, node_id: str) -> bool:
    return any(p.node_id == node_id for p in job.placements)


def _as_report(m: inp.RegisterNode | inp.NodeHeartbeat, attempt: NodeAttempt) -> inp.AttemptReport:
    return inp.AttemptReport(
        event_id=m.event_id,
        occurred_at=m.occurred_at,
        node_id=m.node_id,
        job_id=attempt.job_id,
        attempt_id=attempt.attempt_id,
        status=attempt.status,
        exit_code=attempt.exit_code,
        status_reason=attempt.status_reason,
        checkpoint_at=attempt.checkpoint_at,
    )


def _fence(ctx: Context, job: JobRecord, node_id: str, reason: str) -> None:
    assert job.attempt_id is not None
    ctx.emit(ev.AttemptFenced, node_id=node_id, job_id=job.job_id, attempt_id=job.attempt_id, reason=reason)


def _lose_attempt(ctx: Context, job: JobRecord, node_id: str, reason: str) -> None:
    """S5.7 for one attempt: back to RUNNABLE (no retry or preemption counted), or its stop outcome."""
    share = ctx.state.shares[job.share]
    if job.stop is not None:
        stopped(ctx, job, node_id)
    else:
        requeue(ctx, job, "NODE_LOST", reason)
    finish_share_deletion(ctx, share)


def heartbeat_granularity(state: ClusterState) -> int:
    """How often heartbeats are recorded in the log: enough to decide node loss, not more."""
    return state.heartbeat_timeout_ms // 4


def drain(ctx: Context, m: inp.DrainNode) -> bool:
    return _set_draining(ctx, m, True)


def undrain(ctx: Context, m: inp.UndrainNode) -> bool:
    """An operator puts a drained node back in service (``gpuquota nodes undrain``)."""
    return _set_draining(ctx, m, False)


def _set_draining(ctx: Context, m: inp.DrainNode | inp.UndrainNode, draining: bool) -> bool:
    node = ctx.state.nodes.get(m.node_id)
    if node is None or not node.online:
        return reject(ctx, m, f"Node {m.node_id} is not registered")
    if node.draining != draining:
        ctx.emit(ev.NodeDraining if draining else ev.NodeUndrained, node_id=m.node_id)
    return True


def deregister(ctx: Context, m: inp.DeregisterNode) -> bool:
    node = ctx.state.nodes.get(m.node_id)
    if node is None or not node.online:
        return reject(ctx, m, f"Node {m.node_id} is not registered")
    lose_node(ctx, m.node_id, f"Node {m.node_id} deregistered")
    return True


def lose_node(ctx: Context, node_id: str, reason: str) -> None:
    """S5.7: the node's attempts go back to RUNNABLE (or to their stop outcome), then the node is lost."""
    for job in jobs_on_node(ctx.state, node_id):
        _lose_attempt(ctx, job, node_id, reason)
    ctx.emit(ev.NodeLost, node_id=node_id, reason=reason)


def loss_limit(state: ClusterState) -> int:
    """How old a node's last recorded heartbeat may be before the node is lost.

    Heartbeats are recorded at most every granularity (``heartbeat``), so the last *recorded* one can
    be that much older than the last received one: allow that much more, never declaring a node lost
    while a heartbeat arrived within the timeout (S5.7)."""
    return state.heartbeat_timeout_ms + heartbeat_granularity(state)


def silence_limit(state: ClusterState) -> int:
    """How old a node's last recorded heartbeat is when the node counts as silent (full disruption).

    A reporting node's recorded heartbeat is at most a granularity and one period old; when a whole
    pool is cut off, the freshest node's is about a timeout less one period old by the time the first
    node passes ``loss_limit``. Halfway between the two (5/8 of the timeout) tells them apart with the
    widest margin on both sides (agents heartbeat every 1/6 of the timeout by default)."""
    return (state.heartbeat_timeout_ms + heartbeat_granularity(state)) // 2


def expire_nodes(ctx: Context, now: int) -> None:
    """S5.7: a node whose last recorded heartbeat is too old is lost, unless its whole pool is silent."""
    state = ctx.state
    for pool, since in sorted(state.loss_suspended.items()):
        _resume_if_heard(ctx, pool, since)
    limit = loss_limit(state)
    expired = sorted(n.node_id for n in state.nodes.values() if n.online and now - n.last_heartbeat > limit)
    for pool in sorted({state.nodes[n].pool for n in expired} - state.loss_suspended.keys()):
        if _pool_silent(state, pool, now):
            reason = f"Every node of pool {pool} is silent: node loss suspended until one reports again"
            ctx.emit(ev.NodeLossSuspended, pool=pool, reason=reason)
    for node_id in expired:
        if state.nodes[node_id].pool not in state.loss_suspended:
            lose_node(ctx, node_id, f"Node {node_id} lost")


def _pool_silent(state: ClusterState, pool: str, now: int) -> bool:
    """Full disruption: no online node of ``pool`` was heard from within ``silence_limit``."""
    limit = silence_limit(state)
    return all(now - n.last_heartbeat > limit for n in state.nodes.values() if n.online and n.pool == pool)


def _resume_if_heard(ctx: Context, pool: str, since: int) -> None:
    """A node of the suspended pool was heard from since ``since``: every timer of the pool restarts now."""
    heard = sorted(
        n.node_id
        for n in ctx.state.nodes.values()
        if n.online and n.pool == pool and n.last_heartbeat > since
    )
    if heard:
        ctx.emit(ev.NodeLossResumed, pool=pool, node_id=heard[0])
