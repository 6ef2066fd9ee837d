"""Scheduler inputs: commands from users and facts reported by node agents (imperative names).

Every input is one member of the ``SchedulerInput`` discriminated union (tag: ``type``). The core's
``decide(state, input)`` turns each one into zero or more ``SchedulerEvent`` facts; inputs that cannot
be applied (unknown share, priority out of range, ...) become an ``InputRejected`` event, never an
exception.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from gpuquota.wire.base import (
    INPUT_ID_MAX,
    Frozen,
    JobQueueSpec,
    JobSpec,
    Message,
    Name,
    Priority,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    TrainingPlanSpec,
)


class Input(Message):
    """Base of every scheduler input: its ``event_id`` is shorter than other messages', so that the ids
    derived from it (events, node commands) stay within ``DERIVED_ID_MAX``."""

    event_id: Annotated[str, Field(min_length=1, max_length=INPUT_ID_MAX)]


class CreateSchedulingPolicy(Input):
    type: Literal["CreateSchedulingPolicy"] = "CreateSchedulingPolicy"
    spec: SchedulingPolicySpec


class UpdateSchedulingPolicy(Input):
    type: Literal["UpdateSchedulingPolicy"] = "UpdateSchedulingPolicy"
    spec: SchedulingPolicySpec


class DeleteSchedulingPolicy(Input):
    type: Literal["DeleteSchedulingPolicy"] = "DeleteSchedulingPolicy"
    name: Name


class CreateServiceEnvironment(Input):
    type: Literal["CreateServiceEnvironment"] = "CreateServiceEnvironment"
    spec: ServiceEnvironmentSpec


class UpdateServiceEnvironment(Input):
    type: Literal["UpdateServiceEnvironment"] = "UpdateServiceEnvironment"
    spec: ServiceEnvironmentSpec


class DeleteServiceEnvironment(Input):
    type: Literal["DeleteServiceEnvironment"] = "DeleteServiceEnvironment"
    name: Name


class CreateJobQueue(Input):
    type: Literal["CreateJobQueue"] = "CreateJobQueue"
    spec: JobQueueSpec


class UpdateJobQueue(Input):
    type: Literal["UpdateJobQueue"] = "UpdateJobQueue"
    spec: JobQueueSpec


class DeleteJobQueue(Input):
    type: Literal["DeleteJobQueue"] = "DeleteJobQueue"
    name: Name


class CreateQuotaShare(Input):
    type: Literal["CreateQuotaShare"] = "CreateQuotaShare"
    spec: QuotaShareSpec


class UpdateQuotaShare(Input):
    type: Literal["UpdateQuotaShare"] = "UpdateQuotaShare"
    spec: QuotaShareSpec


class DeleteQuotaShare(Input):
    type: Literal["DeleteQuotaShare"] = "DeleteQuotaShare"
    job_queue: Name
    name: Name


class PutTrainingPlan(Input):
    """Create a training plan, or replace the one of that name (S11; ``gpuquota apply``)."""

    type: Literal["PutTrainingPlan"] = "PutTrainingPlan"
    spec: TrainingPlanSpec


class DeleteTrainingPlan(Input):
    type: Literal["DeleteTrainingPlan"] = "DeleteTrainingPlan"
    name: Name


class SubmitJob(Input):
    type: Literal["SubmitJob"] = "SubmitJob"
    job: JobSpec


class UpdateJobPriority(Input):
    type: Literal["UpdateJobPriority"] = "UpdateJobPriority"
    job_id: str
    priority: Priority


class TerminateJob(Input):
    type: Literal["TerminateJob"] = "TerminateJob"
    job_id: str
    reason: Annotated[str, Field(max_length=1024)] = "Terminated by user"


AttemptStatus = Literal["STARTING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"]


class NodeAttempt(Frozen):
    """An attempt as its node agent knows it: still running (STARTING, RUNNING), or over (its final
    status and exit code) while the scheduler has not yet acknowledged the final report."""

    job_id: str
    attempt_id: str
    status: AttemptStatus
    exit_code: int | None = None
    status_reason: Annotated[str, Field(max_length=1024)] | None = None
    checkpoint_at: int | None = None
    """When the attempt last checkpointed (epoch ms; S12): the newest file of its checkpoint directory,
    or its last completed upload to ``CheckpointConfig.S3Uri``. ``None``: no checkpoint seen."""


class TagJob(Input):
    """TagResource or UntagResource on a job: its whole new tag map (the log keeps the job's tags)."""

    type: Literal["TagJob"] = "TagJob"
    job_id: str
    tags: dict[str, str]


class RegisterNode(Input):
    type: Literal["RegisterNode"] = "RegisterNode"
    node_id: Annotated[str, Field(min_length=1, max_length=256)]
    pool: Name = "default"
    slots: tuple[SlotOffer, ...]
    attempts: tuple[NodeAttempt, ...] | None = None
    """Every attempt the node knows (see ``NodeAttempt``): the scheduler reconciles its log with it
    (docs/semantics.md, S5.7). ``None``: an agent (or a logged input) from before reconciliation."""
    address: Annotated[str, Field(max_length=256)] = ""
    """How the other nodes reach this one (an IP address or host name), for the instances of an attempt
    spread over several nodes (I6); empty: its node id."""
    incarnation: Annotated[str, Field(max_length=64)] = ""
    """A random id the agent draws for each registration. The scheduler's ``RunAttempt`` commands carry
    the incarnation of the node's registration they were dispatched to, and an agent drops those
    addressed to an earlier one: this registration's reconciliation already requeued them (an agent
    restarted, its command feed resumed at its last committed offset, must not run them too).
    Empty: an agent from before incarnations."""
    training_plan: Name | None = None
    """The training plan the node belongs to (S11): its slots are usable only in the plan's windows."""


class NodeHeartbeat(Input):
    type: Literal["NodeHeartbeat"] = "NodeHeartbeat"
    node_id: str
    attempts: tuple[NodeAttempt, ...] | None = None
    """As in ``RegisterNode``: the scheduler reconciles the attempts the node has already reported."""


class DrainNode(Input):
    type: Literal["DrainNode"] = "DrainNode"
    node_id: str


class UndrainNode(Input):
    """An operator puts a drained node back in service (``gpuquota nodes undrain``)."""

    type: Literal["UndrainNode"] = "UndrainNode"
    node_id: str


class DeregisterNode(Input):
    type: Literal["DeregisterNode"] = "DeregisterNode"
    node_id: str


class InstanceOutput(Frozen):
    """Where one instance of an attempt kept its ``/opt/ml/model`` and ``/opt/ml/output`` on its node."""

    host: str
    """``algo-K``."""
    model_dir: str
    output_dir: str


class AttemptReport(Input):
    """A node agent's report on one attempt; idempotent (keyed by attempt id and status)."""

    type: Literal["AttemptReport"] = "AttemptReport"
    node_id: str
    job_id: str
    attempt_id: str
    status: AttemptStatus
    exit_code: int | None = None
    status_reason: Annotated[str, Field(max_length=1024)] | None = None
    outputs: tuple[InstanceOutput, ...] = ()
    """Final reports: the directories of the node's instances of the attempt (I6; none: nothing kept)."""
    checkpoint_at: int | None = None
    """As in ``NodeAttempt``: when the attempt last checkpointed (S12)."""


class Tick(Input):
    """The passage of time: ``occurred_at`` is *now*. Fires timeouts, heartbeat expiry and time limits."""

    type: Literal["Tick"] = "Tick"


SchedulerInput = Annotated[
    CreateSchedulingPolicy
    | UpdateSchedulingPolicy
    | DeleteSchedulingPolicy
    | CreateServiceEnvironment
    | UpdateServiceEnvironment
    | DeleteServiceEnvironment
    | CreateJobQueue
    | UpdateJobQueue
    | DeleteJobQueue
    | CreateQuotaShare
    | UpdateQuotaShare
    | DeleteQuotaShare
    | PutTrainingPlan
    | DeleteTrainingPlan
    | SubmitJob
    | UpdateJobPriority
    | TerminateJob
    | TagJob
    | RegisterNode
    | NodeHeartbeat
    | DrainNode
    | UndrainNode
    | DeregisterNode
    | AttemptReport
    | Tick,
    Field(discriminator="type"),
]

INPUT_ADAPTER: TypeAdapter[SchedulerInput] = TypeAdapter(SchedulerInput)
