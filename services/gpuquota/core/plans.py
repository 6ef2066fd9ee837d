"""Training plans (semantics S11, a gpuquota extension): capacity reserved in time windows.

Theory of operation
-------------------
- **The plan.** A ``TrainingPlanSpec`` reserves ``count`` instances of one unit for a service environment
  in one or more windows ``[start, end)``. While one of its windows is open (``state.plan_windows``), the
  environment's ``maxCapacity`` for the unit rises by ``count`` and each allocated quota share's limit
  by its allocation (``quota.plan_capacity``, ``quota.plan_allocations``); what no share is allocated is
  the environment's, borrowable as any capacity no share covers (S2).
- **Its nodes.** A node agent started with ``--training-plan NAME`` registers as the plan's node: its
  slots are usable only while a window of the plan is open (``NodeRecord.plan_closed``), so the plan's
  capacity is physically there only then. Without a window open the plan adds nothing.
- **Time is an input.** ``advance`` runs on every ``Tick`` and after every change of a plan, and records
  a window's opening (``TrainingPlanWindowOpened``) and closing (``TrainingPlanWindowClosed``) when the
  input's time has passed it; ``evolve`` applies them, so replaying the log rebuilds which windows are
  open, and the same inputs decide the same in both stacks (their drivers feed the same ticks).
- **The end.** A window closes to new work ``grace_seconds`` before its end (``closes_at``; 120 s by
  default, AWS's stop grace): its nodes stop offering slots, and every job on them is preempted in
  the same decision (kind ``TRAINING_PLAN``, ``Preempted (training plan NAME window ended)``) with the
  plan's grace as its SIGTERM-to-SIGKILL time, so that it checkpoints and is off the plan's capacity by
  the end. It is requeued as any preemption (S4.4), and S12 records the work it loses by the same rule.
- **Borrowers.** A borrower (a dispatch beyond its share's limit, S3 phase 2) is placed on a plan's
  nodes only if its ``attemptDurationSeconds`` ends before the window closes, or its share opts in to
  being stopped then (tag ``gpuquota:stopAtPlanEnd=true``); otherwise it takes other slots or waits.
"""

from __future__ import annotations

from typing import Final

from gpuquota.core.checkpoints import gpus_held, lost_ms
from gpuquota.core.context import Context
from gpuquota.core.outcomes import reject
from gpuquota.core.quota import Ledger
from gpuquota.core.state import LEND_AND_BORROW, ClusterState, JobRecord, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import PlanWindow, TrainingPlanSpec

STOP_AT_PLAN_END_TAG: Final = "gpuquota:stopAtPlanEnd"
"""On a quota share: ``true`` lets its borrowers run on a plan's nodes even when they would not end
before the window closes (they are stopped then); ``false`` (the default) keeps them off."""


def tag_problem(tags: dict[str, str]) -> str | None:
    """Why a quota share's training-plan tag is invalid, or None."""
    value = tags.get(STOP_AT_PLAN_END_TAG)
    if value is not None and value not in ("true", "false"):
        return f"Tag {STOP_AT_PLAN_END_TAG} must be true or false, not {value!r}"
    return None


def closes_at(plan: TrainingPlanSpec, start: int, end: int) -> int:
    """When the window ``[start, end)`` closes to new work: its grace period before the end."""
    return max(start, end - plan.grace_seconds * 1000)


def window_at(plan: TrainingPlanSpec, now: int) -> PlanWindow | None:
    """The plan's window open to work at ``now``, if any."""
    for window in plan.windows:
        if window.start <= now < closes_at(plan, window.start, window.end):
            return window
    return None


def next_window(plan: TrainingPlanSpec, now: int) -> PlanWindow | None:
    """The plan's first window that opens after ``now`` (and is open for some time), if any."""
    for window in plan.windows:
        if window.start > now and closes_at(plan, window.start, window.end) > window.start:
            return window
    return None


def plan_problem(state: ClusterState, plan: TrainingPlanSpec) -> str | None:
    """Why the plan cannot be applied as it is, or None: its environment and allocated shares exist,
    and each allocated share has a limit for the plan's unit (an allocation raises it)."""
    environment = state.environments.get(plan.service_environment)
    if environment is None:
        return f"Service environment {plan.service_environment} does not exist"
    for allocation in plan.allocations:
        share = state.shares.get((allocation.job_queue, allocation.quota_share))
        queue = state.queues.get(allocation.job_queue)
        if share is None or share.deleting or queue is None:
            return f"Quota share {allocation.quota_share} does not exist in job queue {allocation.job_queue}"
        if queue.service_environment != plan.service_environment:
            return (
                f"Job queue {allocation.job_queue} is not attached to service environment "
                f"{plan.service_environment}"
            )
        if share.spec.limit(plan.unit) is None:
            return f"Quota share {allocation.quota_share} has no capacity limit for instance type {plan.unit}"
    return None


def put(ctx: Context, m: inp.PutTrainingPlan) -> bool:
    if (problem := plan_problem(ctx.state, m.spec)) is not None:
        return reject(ctx, m, problem)
    ctx.emit(ev.TrainingPlanChanged, spec=m.spec)
    advance(ctx)
    return True


def delete(ctx: Context, m: inp.DeleteTrainingPlan) -> bool:
    """A plan deleted while a window is open closes it at once, as its end would."""
    state = ctx.state
    plan = state.plans.get(m.name)
    if plan is None:
        return reject(ctx, m, f"Training plan {m.name} does not exist")
    window = state.plan_windows.get(m.name)
    if window is not None:
        _close(ctx, plan, window, "deleted")
    ctx.emit(ev.TrainingPlanChanged, spec=plan, status="DELETED")
    return True


def advance(ctx: Context) -> None:
    """Record the windows that closed or opened by ``ctx.now`` (plans in name order).

    An open window closes only once ``now`` has passed its closing time (or the plan no longer lists
    it): an input stamped earlier than the one that opened it (clocks of several writers) keeps it open.
    """
    state, now = ctx.state, ctx.now
    for name in sorted(state.plans):
        plan = state.plans[name]
        current = state.plan_windows.get(name)
        if current is not None:
            listed = next((w for w in plan.windows if w.start == current[0]), None)
            if listed is None or now >= closes_at(plan, listed.start, listed.end):
                _close(ctx, plan, current, "window ended")
                current = None
            elif listed.end != current[1]:  # the plan gave the open window another end
                ctx.emit(ev.TrainingPlanWindowOpened, plan=name, start=listed.start, end=listed.end)
                continue
            else:
                continue
        wanted = window_at(plan, now)
        if wanted is not None:
            ctx.emit(ev.TrainingPlanWindowOpened, plan=name, start=wanted.start, end=wanted.end)


def _close(ctx: Context, plan: TrainingPlanSpec, window: tuple[int, int], why: str) -> None:
    """Close the window and stop every job on the plan's nodes (S11): a preemption without a
    preemptor, with the plan's grace, whose lost work S12's rule records."""
    state, now = ctx.state, ctx.now
    reason = f"Preempted (training plan {plan.name} {why})"
    for job in jobs_on_plan(state, plan.name):
        share = state.shares[job.share]
        environment = state.environment_of_queue(job.share[0])
        assert job.attempt_id is not None and environment is not None  # dispatched in its environment
        figures = Ledger(state, environment).figures(share, job.unit, 0)
        ctx.emit(
            ev.JobPreempted,
            job_id=job.job_id,
            attempt_id=job.attempt_id,
            preemptor_job_id="",
            preemptor_share="",
            victim_share=job.share[1],
            kind="TRAINING_PLAN",
            status_reason=reason,
            figures=ev.PreemptionFigures(
                unit=job.unit,
                preemptor_demand=0,
                pool_capacity=figures.capacity,
                pool_usage=figures.usage,
                reserved_idle=figures.reserved_idle,
                held=figures.held,
                preemptor_share_usage=0,
                preemptor_share_limit=0,
                victim_share_usage=share.usage.get(job.unit, 0),
                victim_share_limit=share.limits.get(job.unit, 0),
            ),
            victim_runtime_ms=0 if job.started_at is None else now - job.started_at,
            lost_ms=lost_ms(job, now),
            lost_gpus=gpus_held(job),
            grace_seconds=float(plan.grace_seconds),
        )
    # Closed after the stops, so that their figures are the window's.
    ctx.emit(ev.TrainingPlanWindowClosed, plan=plan.name, start=window[0], end=window[1])


def jobs_on_plan(state: ClusterState, plan: str) -> list[JobRecord]:
    """Dispatched jobs, not yet being stopped, with a slot on one of the plan's nodes (by job id)."""
    nodes = {node.node_id for node in state.nodes.values() if node.training_plan == plan}
    if not nodes:
        return []
    found = [
        job
        for job in state.jobs.values()
        if job.stop is None and job.dispatched and any(p.node_id in nodes for p in job.placements)
    ]
    return sorted(found, key=lambda job: job.job_id)


def off_limits(
    state: ClusterState, job: JobRecord, share: ShareRecord, pool: str, now: int
) -> frozenset[str]:
    """The plan nodes a borrower may not be placed on: those whose window closes before its
    ``attemptDurationSeconds`` would end (all of them without one), unless its share opts in."""
    if not state.plan_windows or share.spec.tags.get(STOP_AT_PLAN_END_TAG) == "true":
        return frozenset()
    duration = job.attempt_duration_seconds
    ends = None if duration is None else now + duration * 1000
    closing: dict[str, bool] = {}
    for name, (start, end) in state.plan_windows.items():
        plan = state.plans.get(name)
        closing[name] = plan is None or ends is None or ends > closes_at(plan, start, end)
    return frozenset(
        node.node_id
        for node in state.nodes.values()
        if node.pool == pool and node.training_plan is not None and closing.get(node.training_plan, False)
    )


def waits_for(state: ClusterState, job: JobRecord, now: int) -> tuple[str, int] | None:
    """The training plan whose next window would give the job capacity, and when it opens: a plan
    of its environment and unit that allocates to its share, or leaves capacity to borrowers of a
    share that may borrow. The earliest such window (then the plan's name)."""
    environment = state.environment_of_queue(job.share[0])
    share = state.shares.get(job.share)
    if environment is None or share is None:
        return None
    found: list[tuple[int, str]] = []
    for plan in state.plans.values():
        if plan.service_environment != environment.name or plan.unit != job.unit:
            continue
        allocated = any((a.job_queue, a.quota_share) == job.share for a in plan.allocations)
        left = plan.count - sum(a.count for a in plan.allocations)
        if not allocated and not (left > 0 and share.spec.strategy is LEND_AND_BORROW):
            continue
        window = next_window(plan, now)
        if window is not None and plan.name not in state.plan_windows:
            found.append((window.start, plan.name))
    if not found:
        return None
    start, name = min(found)
    return name, start
