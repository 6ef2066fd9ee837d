"""Checkpoint-aware preemption (semantics S12): the work a preemption throws away, and a victim order
that throws away the least of it. An extension, off unless a share or its scheduling policy opts in.

Theory of operation
-------------------
- **The signal.** A node agent reports, per running attempt, when it last checkpointed
  (``checkpoint_at`` of ``NodeAttempt`` in heartbeats and of ``AttemptReport``): the newest file of
  the attempt's checkpoint directory, or the attempt's last completed upload to
  ``CheckpointConfig.S3Uri``. ``record`` turns a newer one for the job's current attempt, from a node
  the attempt is placed on, into ``AttemptCheckpointed``; ``evolve`` keeps it on the job
  (``JobRecord.checkpoint_at``), so replay rebuilds it. A time in the future is taken as *now* (the
  node's clock may run ahead; the log never holds a checkpoint later than the input that reported it).
- **The loss.** An attempt stopped at ``now`` loses, per instance, the time since the later of its
  start (RUNNING) and its last checkpoint: a checkpoint from before the attempt started (the
  directory carries over from the previous attempt) saves nothing of this one. An attempt that has
  not started loses nothing. ``JobPreempted`` records it (``lost_ms``, and ``lost_gpus``: the GPUs
  the attempt held, one per instance whose slot lists none), so the read model, ``/metrics`` and
  ``explain`` show it without recomputing.
- **The order.** With ``gpuquota:victimOrder=leastLostWork`` on the preemptor's quota share (or on
  the scheduling policy of its queue), ``victim_order`` takes the candidates AWS's rules allow, in
  AWS's order (S4.1 and S4.2: ``preemption``), and stably sorts them by the GPU-milliseconds each
  would lose. The search (``preemption.find_victims``) then runs unchanged on that order, with the
  same eligibility rules: the order only permutes AWS's allowed set, so S7.5 holds as before, and
  ties keep AWS's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from gpuquota.core.context import Context
from gpuquota.core.state import ClusterState, JobRecord, VictimKey
from gpuquota.wire import events as ev

VICTIM_ORDER_TAG: Final = "gpuquota:victimOrder"
LEAST_LOST_WORK: Final = "leastLostWork"
VICTIM_ORDERS: Final = ("aws", LEAST_LOST_WORK)
"""``aws`` (the default: S4.1's order) or ``leastLostWork``."""


def tag_problem(tags: dict[str, str]) -> str | None:
    """Why a quota share's victim-order tag is invalid, or None."""
    value = tags.get(VICTIM_ORDER_TAG)
    if value is not None and value not in VICTIM_ORDERS:
        return f"Tag {VICTIM_ORDER_TAG} must be one of {', '.join(VICTIM_ORDERS)}, not {value!r}"
    return None


def least_lost_work(state: ClusterState, preemptor: JobRecord) -> bool:
    """Whether the preemptor's share, or else its queue's scheduling policy, opts in to S12's order."""
    value = state.shares[preemptor.share].spec.tags.get(VICTIM_ORDER_TAG)
    if value is None:
        queue = state.queues.get(preemptor.share[0])
        policy = None if queue is None else state.policies.get(queue.scheduling_policy)
        value = None if policy is None else policy.tags.get(VICTIM_ORDER_TAG)
    return value == LEAST_LOST_WORK


def record(ctx: Context, node_id: str, job_id: str, attempt_id: str, at: int | None) -> None:
    """A node's report that ``attempt_id`` checkpointed at ``at``: recorded when it is news."""
    if at is None:
        return
    job = ctx.state.jobs.get(job_id)
    if job is None or job.attempt_id != attempt_id or not any(p.node_id == node_id for p in job.placements):
        return
    at = min(at, ctx.now)
    if job.checkpoint_at is None or at > job.checkpoint_at:
        ctx.emit(ev.AttemptCheckpointed, job_id=job_id, attempt_id=attempt_id, checkpoint_at=at)


def lost_ms(job: JobRecord, now: int) -> int:
    """Per instance, the work of the job's attempt a stop at ``now`` throws away."""
    if job.started_at is None:
        return 0
    saved = job.started_at if job.checkpoint_at is None else max(job.started_at, job.checkpoint_at)
    return max(0, now - saved)


def gpus_held(job: JobRecord) -> int:
    """The GPUs of the job's attempt: its slots' GPU indices, one per instance whose slot lists none."""
    listed = sum(len(p.gpus) for p in job.placements)
    bare = job.count - sum(len(p.slots) for p in job.placements if p.gpus)
    return listed + max(0, bare)


def lost_gpu_ms(job: JobRecord, now: int) -> int:
    return lost_ms(job, now) * gpus_held(job)


def victim_order(
    state: ClusterState, preemptor: JobRecord, candidates: Iterator[VictimKey], now: int
) -> Iterator[VictimKey]:
    """The candidates in the order the search takes them: AWS's, or S12's when the preemptor opts in."""
    if not least_lost_work(state, preemptor):
        return candidates
    jobs = state.jobs
    listed: Iterable[VictimKey] = list(candidates)
    return iter(sorted(listed, key=lambda key: lost_gpu_ms(jobs[key[2]], now)))  # stable: ties keep AWS's
