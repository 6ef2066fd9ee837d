"""A simulated configuration: an ``apply -f`` file turned into the core's setup inputs.

The file needs a service environment (its capacity limits are the pool: one virtual node per unit with
that many slots) and quota shares; the scheduling policy and job queue are made up when absent. Its
training plans (S11) get one virtual node each, of ``count`` slots, usable in the plan's windows; a
window's times are the trace's clock (``submitted_at``: seconds, as milliseconds here).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuquota.core.checkpoints import LEAST_LOST_WORK, VICTIM_ORDER_TAG
from gpuquota.core.plans import STOP_AT_PLAN_END_TAG
from gpuquota.ctl.api import CliError
from gpuquota.ctl.apply_doc import ApplyDoc, load
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    UNLIMITED_BORROW,
    CapacityLimit,
    JobQueueSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    State,
    Strategy,
    TrainingPlanSpec,
)

DEFAULT_POLICY = "simulated-policy"
DEFAULT_QUEUE = "simulated-queue"


@dataclass(frozen=True)
class Configuration:
    name: str
    policy: SchedulingPolicySpec
    environment: ServiceEnvironmentSpec
    queue: JobQueueSpec
    shares: tuple[QuotaShareSpec, ...]
    """In name order (the order of every per-share figure)."""
    plans: tuple[TrainingPlanSpec, ...] = ()
    """Training plans (S11), each with a virtual node of its own."""

    def setup(self) -> list[tuple[type[Any], dict[str, Any]]]:
        """The inputs (kind, fields) that build this configuration on an empty state, nodes last."""
        out: list[tuple[type[Any], dict[str, Any]]] = [
            (inp.CreateSchedulingPolicy, {"spec": self.policy}),
            (inp.CreateServiceEnvironment, {"spec": self.environment}),
            (inp.CreateJobQueue, {"spec": self.queue}),
        ]
        out += [(inp.CreateQuotaShare, {"spec": share}) for share in self.shares]
        for unit, count in self.capacity().items():
            slots = tuple(SlotOffer(unit=unit) for _ in range(count))
            out.append((inp.RegisterNode, {"node_id": node_id(unit), "slots": slots}))
        for plan in self.plans:
            slots = tuple(SlotOffer(unit=plan.unit) for _ in range(plan.count))
            fields = {"node_id": f"sim-plan-{plan.name}", "slots": slots, "training_plan": plan.name}
            out.append((inp.RegisterNode, fields))
            out.append((inp.PutTrainingPlan, {"spec": plan}))
        return out

    def victim_order(self) -> str:
        """S12's victim order, when the policy or any share asks for one (``aws``: AWS's, the default)."""
        tags = [self.policy.tags, *(share.tags for share in self.shares)]
        orders = {t[VICTIM_ORDER_TAG] for t in tags if VICTIM_ORDER_TAG in t}
        return LEAST_LOST_WORK if LEAST_LOST_WORK in orders else "aws"

    def with_victim_order(self, order: str) -> Configuration:
        """This configuration with ``order`` on its scheduling policy (``gpuquota simulate --victim-order``),
        named after it."""
        tags = {**self.policy.tags, VICTIM_ORDER_TAG: order}
        policy = self.policy.model_copy(update={"tags": tags})
        return replace(self, name=f"{self.name} ({order})", policy=policy)

    def capacity(self) -> dict[str, int]:
        return {c.unit: c.max_capacity for c in self.environment.capacity_limits if c.max_capacity > 0}


def node_id(unit: str) -> str:
    return f"sim-{unit}"


def _state(value: str) -> State:
    return State(value)


def configuration(doc: ApplyDoc, name: str) -> Configuration:
    if doc.serviceEnvironment is None:
        raise CliError(f"{name}: a simulated configuration needs a serviceEnvironment (its capacity)")
    if not doc.quotaShares:
        raise CliError(f"{name}: a simulated configuration needs quotaShares")
    env_doc = doc.serviceEnvironment
    policy_name = doc.schedulingPolicy.name if doc.schedulingPolicy else DEFAULT_POLICY
    queue_doc = doc.jobQueue
    queue_name = queue_doc.name if queue_doc else DEFAULT_QUEUE
    environment = ServiceEnvironmentSpec(
        name=env_doc.name,
        state=_state(env_doc.state),
        capacity_limits=tuple(
            CapacityLimit(unit=u, max_capacity=n) for u, n in env_doc.capacityLimits.items()
        ),
    )
    queue = JobQueueSpec(
        name=queue_name,
        priority=queue_doc.priority if queue_doc else 1,
        service_environment=environment.name,
        scheduling_policy=policy_name,
    )
    shares = []
    for share in sorted(doc.quotaShares, key=lambda s: s.name):
        if share.jobQueue not in (None, queue_name):
            raise CliError(
                f"{name}: quota share {share.name} is in job queue {share.jobQueue}, not {queue_name}"
            )
        strategy = Strategy(share.strategy)
        shares.append(
            QuotaShareSpec(
                name=share.name,
                job_queue=queue_name,
                capacity_limits=tuple(
                    CapacityLimit(unit=u, max_capacity=n) for u, n in share.capacityLimits.items()
                ),
                strategy=strategy,
                borrow_limit=share.borrowLimit if share.borrowLimit is not None else UNLIMITED_BORROW,
                in_share_preemption=share.inSharePreemption == "ENABLED",
                state=_state(share.state),
                tags={k: v for k, v in (share.tags or {}).items() if k == STOP_AT_PLAN_END_TAG},
            )
        )
    plans = []
    for plan in doc.trainingPlans:
        fields = doc.plan_spec_fields(plan)
        fields["service_environment"] = environment.name
        fields["allocations"] = [{**a, "job_queue": queue_name} for a in fields["allocations"]]
        plans.append(TrainingPlanSpec.model_validate(fields))
    policy = SchedulingPolicySpec(name=policy_name)
    return Configuration(name, policy, environment, queue, tuple(shares), tuple(plans))


def load_configuration(path: str | Path) -> Configuration:
    return configuration(load(path), Path(path).name)
