"""The ``gpuquota apply -f FILE.yaml`` document: its sections, validated as pydantic models.

The file (see ``deploy/examples/worked-example.yaml``) has up to four sections, each optional::

    schedulingPolicy:   {name, idleResourceAssignmentStrategy: FIFO, tags}
    serviceEnvironment: {name, state, capacityLimits: {UNIT: N}, tags}
    jobQueue:           {name, priority, state, schedulingPolicy, serviceEnvironment, tags}
    quotaShares:        [{name, jobQueue, capacityLimits: {UNIT: N}, strategy, borrowLimit,
                          inSharePreemption, state, tags}, ...]
    trainingPlans:      [{name, serviceEnvironment, capacityUnit, count, windows: [{start, end}],
                          allocations: {SHARE: N} or [{jobQueue, quotaShare, count}],
                          gracePeriodSeconds, tags}, ...]

A job queue's policy and environment default to the file's; a share's job queue defaults to the file's;
a training plan's service environment and its allocations' job queue too. A window's ``start`` and
``end`` are ISO 8601 times (``2026-12-07T09:00:00Z``; without a zone: UTC) or epoch milliseconds.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuquota.ctl.api import CliError
from gpuquota.wire.base import (
    MAX_SHARE_LIMITS,
    MIN_SHARE_LIMITS,
    PLAN_GRACE_SECONDS,
    UNLIMITED_BORROW,
    CapacityLimit,
    QueuePriority,
    QuotaShareSpec,
    TrainingPlanSpec,
)

State = Literal["ENABLED", "DISABLED"]


def _on_off(value: Any) -> Any:
    if isinstance(value, bool):
        return "ENABLED" if value else "DISABLED"
    return value


SAGEMAKER_TRAINING = "SAGEMAKER_TRAINING"
"""The type of every service environment and job queue that ``apply`` creates."""


def capacity_limits(limits: dict[str, int]) -> list[dict[str, Any]]:
    """A document's ``{UNIT: N}`` as the API's ``capacityLimits``."""
    return [{"capacityUnit": u, "maxCapacity": n} for u, n in limits.items()]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class PolicyDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    idleResourceAssignmentStrategy: Literal["FIFO"] = "FIFO"
    tags: dict[str, str] | None = None

    def create_request(self) -> dict[str, Any]:
        """The ``create_scheduling_policy`` parameters (but the tags)."""
        strategy = {"idleResourceAssignmentStrategy": self.idleResourceAssignmentStrategy}
        return {"name": self.name, "quotaSharePolicy": strategy}


class EnvironmentDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    state: State = "ENABLED"
    capacityLimits: dict[str, Annotated[int, Field(ge=0)]] = Field(min_length=1)
    tags: dict[str, str] | None = None

    _state = field_validator("state", mode="before")(_on_off)

    def create_request(self) -> dict[str, Any]:
        """The ``create_service_environment`` parameters (but the tags)."""
        return {
            "serviceEnvironmentName": self.name,
            "serviceEnvironmentType": SAGEMAKER_TRAINING,
            "state": self.state,
            "capacityLimits": capacity_limits(self.capacityLimits),
        }


class QueueDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    priority: QueuePriority = 1
    state: State = "ENABLED"
    schedulingPolicy: str | None = None
    serviceEnvironment: str | None = None
    tags: dict[str, str] | None = None

    _state = field_validator("state", mode="before")(_on_off)

    def create_request(self, policy: str, environment: str) -> dict[str, Any]:
        """The ``create_job_queue`` parameters (but the tags), given its policy's ARN and its environment."""
        return {
            "jobQueueName": self.name,
            "jobQueueType": SAGEMAKER_TRAINING,
            "state": self.state,
            "priority": self.priority,
            "schedulingPolicyArn": policy,
            "serviceEnvironmentOrder": environment_order(environment),
        }


def environment_order(environment: str) -> list[dict[str, Any]]:
    """A job queue's ``serviceEnvironmentOrder``: its one service environment."""
    return [{"order": 1, "serviceEnvironment": environment}]


class ShareDoc(_Doc):
    name: str = Field(min_length=1, max_length=128)
    jobQueue: str | None = None
    capacityLimits: dict[str, int] = Field(min_length=MIN_SHARE_LIMITS, max_length=MAX_SHARE_LIMITS)
    strategy: Literal["RESERVE", "LEND", "LEND_AND_BORROW"]
    borrowLimit: int | None = Field(default=None, ge=UNLIMITED_BORROW)
    inSharePreemption: State = "DISABLED"
    state: State = "ENABLED"
    tags: dict[str, str] | None = None

    _flags = field_validator("state", "inSharePreemption", mode="before")(_on_off)

    def sharing(self) -> dict[str, Any]:
        """The share's ``resourceSharingConfiguration``."""
        sharing: dict[str, Any] = {"strategy": self.strategy}
        if self.strategy == "LEND_AND_BORROW":
            sharing["borrowLimit"] = UNLIMITED_BORROW if self.borrowLimit is None else self.borrowLimit
        return sharing

    def preemption(self) -> dict[str, Any]:
        """The share's ``preemptionConfiguration``."""
        return {"inSharePreemption": self.inSharePreemption}

    def create_request(self, queue: str) -> dict[str, Any]:
        """The ``create_quota_share`` parameters (but the tags), in job queue ``queue``."""
        return {
            "quotaShareName": self.name,
            "jobQueue": queue,
            "capacityLimits": capacity_limits(self.capacityLimits),
            "resourceSharingConfiguration": self.sharing(),
            "preemptionConfiguration": self.preemption(),
            "state": self.state,
        }

    def spec(self, queue: str) -> QuotaShareSpec:
        """The wire spec this document asks for (its validation is the quota share's rules)."""
        return QuotaShareSpec(
            name=self.name,
            job_queue=queue,
            capacity_limits=tuple(
                CapacityLimit(unit=u, max_capacity=n) for u, n in self.capacityLimits.items()
            ),
            strategy=self.strategy,
            borrow_limit=UNLIMITED_BORROW if self.borrowLimit is None else self.borrowLimit,
            in_share_preemption=self.inSharePreemption == "ENABLED",
            state=self.state,
            tags=self.tags or {},
        )


def _epoch_ms(value: Any) -> Any:
    """A window bound: epoch ms as given, an ISO 8601 time (UTC unless it names a zone) converted."""
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000)
    if isinstance(value, str) and not value.isdigit():
        try:
            return _epoch_ms(dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 time or epoch milliseconds") from None
    return value


class WindowDoc(_Doc):
    start: Annotated[int, Field(ge=0)]
    end: Annotated[int, Field(ge=0)]

    _bounds = field_validator("start", "end", mode="before")(_epoch_ms)


class AllocationDoc(_Doc):
    quotaShare: str = Field(min_length=1, max_length=128)
    jobQueue: str | None = None
    count: Annotated[int, Field(ge=1)]


class PlanDoc(_Doc):
    """A training plan (S11): ``count`` instances of ``capacityUnit`` in each window."""

    name: str = Field(min_length=1, max_length=128)
    serviceEnvironment: str | None = None
    capacityUnit: str = Field(min_length=1, max_length=128)
    count: Annotated[int, Field(ge=1)]
    windows: list[WindowDoc] = Field(min_length=1)
    allocations: list[AllocationDoc] | dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: list[AllocationDoc]()
    )
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=86400)] = PLAN_GRACE_SECONDS
    tags: dict[str, str] | None = None

    def request(self, environment: str, queue: str | None) -> dict[str, Any]:
        """The ``POST /gpuquota/v1/plans`` body (``queue``: the file's job queue, the default)."""
        listed = (
            [AllocationDoc(quotaShare=k, count=v) for k, v in self.allocations.items()]
            if isinstance(self.allocations, dict)
            else self.allocations
        )
        allocations = []
        for allocation in listed:
            job_queue = allocation.jobQueue or queue
            if job_queue is None:
                raise ValueError(
                    f"allocation to {allocation.quotaShare} needs a jobQueue (the file has none)"
                )
            allocations.append(
                {"jobQueue": job_queue, "quotaShare": allocation.quotaShare, "count": allocation.count}
            )
        return {
            "trainingPlanName": self.name,
            "serviceEnvironment": environment,
            "capacityUnit": self.capacityUnit,
            "count": self.count,
            "windows": [{"start": w.start, "end": w.end} for w in self.windows],
            "allocations": allocations,
            "gracePeriodSeconds": self.gracePeriodSeconds,
            "tags": self.tags or {},
        }


class ApplyDoc(_Doc):
    schedulingPolicy: PolicyDoc | None = None
    serviceEnvironment: EnvironmentDoc | None = None
    jobQueue: QueueDoc | None = None
    quotaShares: list[ShareDoc] = Field(default_factory=list)
    trainingPlans: list[PlanDoc] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> ApplyDoc:
        if self.jobQueue is not None:
            if self.jobQueue.schedulingPolicy is None and self.schedulingPolicy is None:
                raise ValueError(
                    "jobQueue.schedulingPolicy is required when the file has no schedulingPolicy"
                )
            if self.jobQueue.serviceEnvironment is None and self.serviceEnvironment is None:
                raise ValueError(
                    "jobQueue.serviceEnvironment is required when the file has no serviceEnvironment"
                )
        seen: set[tuple[str, str]] = set()
        for i, share in enumerate(self.quotaShares):
            queue = share.jobQueue or (self.jobQueue.name if self.jobQueue else None)
            if queue is None:
                raise ValueError(f"quotaShares[{i}].jobQueue is required when the file has no jobQueue")
            if (queue, share.name) in seen:
                raise ValueError(f"quotaShares[{i}]: quota share {share.name} is listed twice")
            seen.add((queue, share.name))
            try:
                share.spec(queue)
            except ValidationError as exc:
                raise ValueError(f"quotaShares[{i}]: {exc.errors()[0]['msg']}") from None
        for i, plan in enumerate(self.trainingPlans):
            if plan.serviceEnvironment is None and self.serviceEnvironment is None:
                raise ValueError(
                    f"trainingPlans[{i}].serviceEnvironment is required when the file has no "
                    "serviceEnvironment"
                )
            try:
                TrainingPlanSpec.model_validate(self.plan_spec_fields(plan))
            except ValidationError as exc:
                raise ValueError(f"trainingPlans[{i}]: {exc.errors()[0]['msg']}") from None
        return self

    def plan_request(self, plan: PlanDoc) -> dict[str, Any]:
        environment = plan.serviceEnvironment or (
            self.serviceEnvironment.name if self.serviceEnvironment else None
        )
        assert environment is not None
        return plan.request(environment, self.jobQueue.name if self.jobQueue else None)

    def plan_spec_fields(self, plan: PlanDoc) -> dict[str, Any]:
        """The wire spec's fields (to validate the plan's own rules before anything is sent)."""
        body = self.plan_request(plan)
        return {
            "name": body["trainingPlanName"],
            "service_environment": body["serviceEnvironment"],
            "unit": body["capacityUnit"],
            "count": body["count"],
            "windows": body["windows"],
            "allocations": [
                {"job_queue": a["jobQueue"], "quota_share": a["quotaShare"], "count": a["count"]}
                for a in body["allocations"]
            ],
            "grace_seconds": body["gracePeriodSeconds"],
            "tags": body["tags"],
        }

    def policy_of(self, queue: QueueDoc) -> str:
        name = queue.schedulingPolicy or (self.schedulingPolicy.name if self.schedulingPolicy else None)
        assert name is not None
        return name

    def environment_of(self, queue: QueueDoc) -> str:
        name = queue.serviceEnvironment or (self.serviceEnvironment.name if self.serviceEnvironment else None)
        assert name is not None
        return name

    def queue_of(self, share: ShareDoc) -> str:
        name = share.jobQueue or (self.jobQueue.name if self.jobQueue else None)
        assert name is not None
        return name


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse(data: Any, source: str = "the file") -> ApplyDoc:
    """Validate a loaded document; raise ``CliError`` naming the first problem."""
    if data is None:
        raise CliError(f"{source}: the file is empty")
    if not isinstance(data, dict):
        raise CliError(f"{source}: expected a mapping with schedulingPolicy, serviceEnvironment, ...")
    try:
        return ApplyDoc.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = _where(tuple(error["loc"]))
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(_section(tuple(error["loc"])).model_fields)
            return _raise(f"{source}: unknown key {where} (expected one of: {allowed})")
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "missing":
            return _raise(f"{source}: missing required key {where}")
        return _raise(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def _section(loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The model that an ``extra_forbidden`` error at ``loc`` is about."""
    sections: dict[int | str, type[BaseModel]] = {
        "schedulingPolicy": PolicyDoc,
        "serviceEnvironment": EnvironmentDoc,
        "jobQueue": QueueDoc,
        "quotaShares": ShareDoc,
        "trainingPlans": PlanDoc,
    }
    return sections.get(loc[0], ApplyDoc) if len(loc) > 1 else ApplyDoc


def _raise(message: str) -> ApplyDoc:
    raise CliError(message)


def load(path: str | Path) -> ApplyDoc:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise CliError(f"{path}: invalid YAML{at}: {problem}") from None
    return parse(data, str(path))


# ----- applying ------------------------------------------------------------------------------------
