"""Shared pieces of the wire contract: the frozen base model, enums and resource specs.

Every message that crosses a process boundary is a frozen pydantic model with a ``type`` tag and a
``schema_version``. Times are integers: milliseconds since the Unix epoch, as in the AWS Batch API.
Resource *specs* are the complete desired configuration of one resource; updates carry the whole new
spec (the gateway merges partial AWS updates into a full spec before sending it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
MAX_JOB_PRIORITY = 9999
Priority = Annotated[int, Field(ge=0, le=MAX_JOB_PRIORITY)]
"""A job's ``schedulingPriority`` (higher runs first)."""
QueuePriority = Annotated[int, Field(ge=0, le=1000)]
"""A job queue's ``priority``."""
EpochMs = Annotated[int, Field(ge=0)]


class Frozen(BaseModel):
    """Base of every wire model: immutable, and unknown fields are an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def _envelope_required(schema: dict[str, Any]) -> None:
    """In the JSON Schema, ``type`` and ``schema_version`` are required although they have defaults:
    a record without its ``type`` cannot be told apart (the scheduler dead-letters it), and every
    message on the wire carries both (interface I4)."""
    required = schema.setdefault("required", [])
    for name in ("type", "schema_version"):
        if name in schema.get("properties", {}) and name not in required:
            required.insert(0, name)


INPUT_ID_MAX = 256
"""The longest ``event_id`` a producer may give an input (``gpuquota.wire.inputs.Input``)."""
DERIVED_ID_MAX = 1024
"""The longest ``event_id`` of any message: decided events are ``<input id>/<n>`` and node commands
``<event id>/<node id>`` (a node id has at most 256 characters), so they always fit."""


class Message(Frozen):
    """Base of every message: an id, a time and a schema version (the ``type`` tag is per class)."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_envelope_required)

    event_id: Annotated[str, Field(min_length=1, max_length=DERIVED_ID_MAX)]
    occurred_at: EpochMs
    schema_version: Literal[1] = 1


class State(StrEnum):
    ENABLED = "ENABLED"
    DISABLED = "DISABLED"


class Strategy(StrEnum):
    RESERVE = "RESERVE"
    LEND = "LEND"
    LEND_AND_BORROW = "LEND_AND_BORROW"


class JobStatus(StrEnum):
    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    RUNNABLE = "RUNNABLE"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


DISPATCHED_STATUSES = frozenset({JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING})
TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED})


class CapacityLimit(Frozen):
    unit: Annotated[str, Field(min_length=1, max_length=128)]
    max_capacity: Annotated[int, Field(ge=0)]


class SchedulingPolicySpec(Frozen):
    name: Name
    idle_resource_assignment_strategy: Literal["FIFO"] = "FIFO"
    backfill: bool = False
    """gpuquota extension (S3.2): let later jobs of a share run while its head cannot be placed."""
    tags: dict[str, str] = Field(default_factory=dict)


UNITS_ONCE_RULE = "capacityLimits lists a capacityUnit more than once"
BORROW_LIMIT_RULE = "borrowLimit can only be applied to quota shares with a strategy of LEND_AND_BORROW"
UNLIMITED_BORROW = -1
"""A ``borrowLimit`` of -1: a LEND_AND_BORROW share borrows without bound (S2.3). It is also the
field's floor and its default (no borrow limit given)."""
MIN_SHARE_LIMITS, MAX_SHARE_LIMITS = 1, 5
"""How many capacity limits (``capacityLimits``) a quota share lists, at most one per unit."""


def _units_once(limits: tuple[CapacityLimit, ...]) -> None:
    units = [c.unit for c in limits]
    if len(set(units)) != len(units):
        raise PydanticCustomError("capacity_units", UNITS_ONCE_RULE)


class ServiceEnvironmentSpec(Frozen):
    name: Name
    state: State = State.ENABLED
    capacity_limits: tuple[CapacityLimit, ...] = ()
    pool: Name = "default"
    tags: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> ServiceEnvironmentSpec:
        _units_once(self.capacity_limits)
        return self


class TimeLimitAction(Frozen):
    reason: Annotated[str, Field(min_length=1, max_length=1024)]
    state: Literal["RUNNABLE"] = "RUNNABLE"
    max_time_seconds: Annotated[int, Field(ge=1, le=86400)]
    action: Literal["TERMINATE"] = "TERMINATE"


class JobQueueSpec(Frozen):
    name: Name
    state: State = State.ENABLED
    priority: QueuePriority = 1
    service_environment: Name
    scheduling_policy: Name
    time_limit_actions: tuple[TimeLimitAction, ...] = ()
    tags: dict[str, str] = Field(default_factory=dict)


class QuotaShareSpec(Frozen):
    name: Name
    job_queue: Name
    capacity_limits: Annotated[
        tuple[CapacityLimit, ...], Field(min_length=MIN_SHARE_LIMITS, max_length=MAX_SHARE_LIMITS)
    ]
    strategy: Strategy
    borrow_limit: Annotated[int, Field(ge=UNLIMITED_BORROW)] = UNLIMITED_BORROW
    in_share_preemption: bool = False
    state: State = State.ENABLED
    tags: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> QuotaShareSpec:
        for index, cap in enumerate(self.capacity_limits):
            if cap.max_capacity < 1:
                raise PydanticCustomError(
                    "max_capacity",
                    "capacityLimits[{index}].maxCapacity must be at least 1, got {count}",
                    {"index": index, "count": cap.max_capacity},
                )
        _units_once(self.capacity_limits)
        if self.borrow_limit != UNLIMITED_BORROW and self.strategy is not Strategy.LEND_AND_BORROW:
            raise PydanticCustomError("borrow_limit", BORROW_LIMIT_RULE)
        return self

    def limit(self, unit: str) -> int | None:
        for cap in self.capacity_limits:
            if cap.unit == unit:
                return cap.max_capacity
        return None


class ExitRule(Frozen):
    action: Literal["RETRY", "EXIT"]
    on_status_reason: Annotated[str, Field(max_length=512)] = "*"


class JobSpec(Frozen):
    """Everything the scheduler needs to know about a submitted job."""

    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    job_name: Annotated[str, Field(min_length=1, max_length=128)]
    job_queue: Name
    quota_share: Name
    priority: Priority = 0
    unit: Annotated[str, Field(min_length=1, max_length=128)]
    count: Annotated[int, Field(ge=1)] = 1
    created_at: EpochMs
    retry_attempts: Annotated[int, Field(ge=1, le=10)] = 1
    evaluate_on_exit: Annotated[tuple[ExitRule, ...], Field(max_length=5)] = ()
    preemption_retries: Annotated[int, Field(ge=0)] | None = None
    attempt_duration_seconds: Annotated[int, Field(ge=1)] | None = None
    payload: str = ""
    tags: dict[str, str] = Field(default_factory=dict)
    """The job's AWS tags (SubmitServiceJob ``tags``); carried for the read model, not scheduling."""
    client_token: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    """SubmitServiceJob ``clientToken``, in the log so that a retry after a restart finds the job."""
    request_digest: str = ""
    """SHA-256 of the submit request without its ``clientToken`` (a reused token must match it)."""


PLAN_GRACE_SECONDS = 120
"""A training plan's default stop grace (S11): AWS's, so that its jobs checkpoint before the end."""
MAX_PLAN_WINDOWS = 100


class PlanWindow(Frozen):
    """One window ``[start, end)`` of a training plan, in epoch ms."""

    start: EpochMs
    end: EpochMs


class PlanAllocation(Frozen):
    """Instances of a training plan given to one quota share: its limit rises by ``count`` in a window."""

    job_queue: Name
    quota_share: Name
    count: Annotated[int, Field(ge=1, le=2**31 - 1)]


class TrainingPlanSpec(Frozen):
    """A training plan (S11, a gpuquota extension): ``count`` instances of ``unit`` reserved for a
    service environment in each of its windows, some of them allocated to quota shares."""

    name: Name
    service_environment: Name
    unit: Annotated[str, Field(min_length=1, max_length=128)]
    count: Annotated[int, Field(ge=1, le=2**31 - 1)]
    windows: Annotated[tuple[PlanWindow, ...], Field(min_length=1, max_length=MAX_PLAN_WINDOWS)]
    allocations: Annotated[tuple[PlanAllocation, ...], Field(max_length=20)] = ()
    grace_seconds: Annotated[int, Field(ge=0, le=86400)] = PLAN_GRACE_SECONDS
    """How long before a window's end its jobs get SIGTERM, and their SIGTERM-to-SIGKILL grace."""
    tags: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> TrainingPlanSpec:
        previous_end = -1
        for index, window in enumerate(self.windows):
            if window.end <= window.start:
                raise PydanticCustomError(
                    "plan_window", "windows[{index}] must end after it starts", {"index": index}
                )
            if window.start < previous_end:
                raise PydanticCustomError(
                    "plan_window",
                    "windows[{index}] must start after the previous window ends (in order, no overlap)",
                    {"index": index},
                )
            previous_end = window.end
        shares = [(a.job_queue, a.quota_share) for a in self.allocations]
        if len(set(shares)) != len(shares):
            raise PydanticCustomError("plan_allocation", "allocations name a quota share more than once")
        total = sum(a.count for a in self.allocations)
        if total > self.count:
            raise PydanticCustomError(
                "plan_allocation",
                "allocations give {total} instances, more than the plan's count {count}",
                {"total": total, "count": self.count},
            )
        return self


class SlotOffer(Frozen):
    """One instance of ``unit`` that a node offers, with the GPU indices it carries."""

    unit: Annotated[str, Field(min_length=1, max_length=128)]
    gpus: tuple[int, ...] = ()


class Placement(Frozen):
    """The slots of one node given to one attempt."""

    node_id: str
    slots: tuple[int, ...]
    gpus: tuple[int, ...] = ()
