"""Scheduler events: the facts the core decides (past-tense names). The event log is a list of these.

``evolve(state, event)`` applies one of them; folding the log from an empty state rebuilds the live
state exactly. Job events carry the job's new ``status`` so that consumers of the job-state topic can
follow a job without knowing every event type.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from gpuquota.wire.base import (
    Frozen,
    JobQueueSpec,
    JobSpec,
    JobStatus,
    Message,
    Placement,
    Priority,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    TrainingPlanSpec,
)
from gpuquota.wire.inputs import InstanceOutput

ResourceStatus = Literal["VALID", "DELETING", "DELETED"]


class InputRejected(Message):
    type: Literal["InputRejected"] = "InputRejected"
    input_event_id: str
    input_type: str
    reason: str
    job_id: str | None = None
    node_id: str | None = None
    """Set when a node's heartbeat is rejected (the node is unknown or lost): it must register again."""


class SchedulingPolicyChanged(Message):
    type: Literal["SchedulingPolicyChanged"] = "SchedulingPolicyChanged"
    spec: SchedulingPolicySpec
    status: ResourceStatus = "VALID"


class ServiceEnvironmentChanged(Message):
    type: Literal["ServiceEnvironmentChanged"] = "ServiceEnvironmentChanged"
    spec: ServiceEnvironmentSpec
    status: ResourceStatus = "VALID"


class JobQueueChanged(Message):
    type: Literal["JobQueueChanged"] = "JobQueueChanged"
    spec: JobQueueSpec
    status: ResourceStatus = "VALID"


class QuotaShareChanged(Message):
    type: Literal["QuotaShareChanged"] = "QuotaShareChanged"
    spec: QuotaShareSpec
    status: ResourceStatus = "VALID"


class JobAccepted(Message):
    """SUBMITTED -> RUNNABLE: the job is valid and queued in its share."""

    type: Literal["JobAccepted"] = "JobAccepted"
    job: JobSpec
    status: Literal[JobStatus.RUNNABLE] = JobStatus.RUNNABLE


class JobDispatched(Message):
    """RUNNABLE -> SCHEDULED: the job holds ``count`` slots of ``unit`` from now on."""

    type: Literal["JobDispatched"] = "JobDispatched"
    job_id: str
    attempt_id: str
    attempt_number: int
    unit: str
    count: int
    placements: tuple[Placement, ...]
    phase: Literal["IN_QUOTA", "BORROW", "HOLD"]
    borrowed: int
    """How many of the job's instances were above its share's limit when it was dispatched."""
    status: Literal[JobStatus.SCHEDULED] = JobStatus.SCHEDULED


class JobStarting(Message):
    type: Literal["JobStarting"] = "JobStarting"
    job_id: str
    attempt_id: str
    status: Literal[JobStatus.STARTING] = JobStatus.STARTING


class JobRunning(Message):
    type: Literal["JobRunning"] = "JobRunning"
    job_id: str
    attempt_id: str
    status: Literal[JobStatus.RUNNING] = JobStatus.RUNNING


class JobSucceeded(Message):
    type: Literal["JobSucceeded"] = "JobSucceeded"
    job_id: str
    attempt_id: str
    status_reason: str = "Received status from SageMaker: Training job completed"
    """S9.3: AWS's text (``gpuquota.core.lifecycle.SUCCEEDED_REASON``)."""
    status: Literal[JobStatus.SUCCEEDED] = JobStatus.SUCCEEDED


class JobFailed(Message):
    """Any state -> FAILED. Releases the job's capacity if it held any."""

    type: Literal["JobFailed"] = "JobFailed"
    job_id: str
    attempt_id: str | None = None
    status_reason: str
    is_terminated: bool = False
    preempted: bool = False
    """True when the failure is the outcome of a preemption (retries before termination exhausted)."""
    status: Literal[JobStatus.FAILED] = JobStatus.FAILED


RequeueCause = Literal["RETRY", "PREEMPTED", "NODE_LOST", "HANDED_BACK"]


class JobRequeued(Message):
    """Dispatched -> RUNNABLE: the attempt is over, its capacity is released, the job keeps its place."""

    type: Literal["JobRequeued"] = "JobRequeued"
    job_id: str
    attempt_id: str
    cause: RequeueCause
    status_reason: str
    status: Literal[JobStatus.RUNNABLE] = JobStatus.RUNNABLE


class PreemptionFigures(Frozen):
    """The capacity figures at the moment a preemption was decided (unit ``unit`` of the pool)."""

    unit: str
    preemptor_demand: int
    pool_capacity: int
    pool_usage: int
    reserved_idle: int
    held: int
    preemptor_share_usage: int
    preemptor_share_limit: int
    victim_share_usage: int
    victim_share_limit: int


PreemptionKind = Literal["CROSS_SHARE", "IN_SHARE", "TRAINING_PLAN"]
"""``TRAINING_PLAN``: a plan's window ends (S11); it has no preemptor job (``preemptor_job_id`` empty)."""


class JobPreempted(Message):
    """A preemption decision. The victim keeps its capacity until its node reports it stopped."""

    type: Literal["JobPreempted"] = "JobPreempted"
    job_id: str
    attempt_id: str
    preemptor_job_id: str
    preemptor_share: str
    victim_share: str
    kind: PreemptionKind
    status_reason: str
    figures: PreemptionFigures
    victim_runtime_ms: int = 0
    """S10.3: how long the victim's attempt had been RUNNING (0 if it had not started)."""
    lost_ms: int = 0
    """S12: the work the victim loses, per instance: since its last checkpoint in this attempt, or since
    it started RUNNING without one (0 if it had not started)."""
    lost_gpus: int = 0
    """S12: the GPUs the victim's attempt held (one per instance whose slot lists none)."""
    grace_seconds: float | None = None
    """SIGTERM to SIGKILL for this stop; ``None``: the node agent's (a training plan's own, S11)."""


class AttemptCheckpointed(Message):
    """S12: a node reported a newer checkpoint of the job's current attempt."""

    type: Literal["AttemptCheckpointed"] = "AttemptCheckpointed"
    job_id: str
    attempt_id: str
    checkpoint_at: int


StopCause = Literal["TERMINATED", "TIMEOUT", "SHARE_DELETED", "INSTANCE_FAILED"]
"""``INSTANCE_FAILED``: one node's part of an attempt spread over several nodes failed (its reason)."""


class JobStopRequested(Message):
    """The scheduler asks the job's nodes to stop its attempt; capacity is held until they report."""

    type: Literal["JobStopRequested"] = "JobStopRequested"
    job_id: str
    attempt_id: str
    cause: StopCause
    status_reason: str


class AttemptPartEnded(Message):
    """One node's part of an attempt placed on several nodes is over while other parts still run: the
    attempt ends once, when its last part has ended (a failed part first stops the others)."""

    type: Literal["AttemptPartEnded"] = "AttemptPartEnded"
    job_id: str
    attempt_id: str
    node_id: str
    status: Literal["SUCCEEDED", "FAILED", "STOPPED"]
    status_reason: str | None = None


class AttemptOutputsRecorded(Message):
    """Where a node kept the attempt's ``/opt/ml/model`` and ``/opt/ml/output`` (its final report's
    ``outputs``); for the read model: scheduling ignores it."""

    type: Literal["AttemptOutputsRecorded"] = "AttemptOutputsRecorded"
    job_id: str
    attempt_id: str
    node_id: str
    outputs: tuple[InstanceOutput, ...]


class JobPriorityChanged(Message):
    type: Literal["JobPriorityChanged"] = "JobPriorityChanged"
    job_id: str
    priority: Priority


class JobTagsChanged(Message):
    """A job's tags (TagResource, UntagResource); read-model only: scheduling ignores tags."""

    type: Literal["JobTagsChanged"] = "JobTagsChanged"
    job_id: str
    tags: dict[str, str]


BlockedCode = Literal[
    "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE",
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
]
"""Why a RUNNABLE head job is blocked (S9.1): AWS's codes, also the only valid time-limit reasons."""


class JobBlocked(Message):
    """The head of a quota share is blocked (S9.1); its ``statusReason`` is ``status_reason`` from now.

    Recorded when the code or its figures change: ``since`` (S9.2) is kept while the code stays."""

    type: Literal["JobBlocked"] = "JobBlocked"
    job_id: str
    job_queue: str
    quota_share: str
    code: BlockedCode
    status_reason: str


class JobUnblocked(Message):
    """The job recorded as blocked in its share no longer is (it fits, moved, or left the head)."""

    type: Literal["JobUnblocked"] = "JobUnblocked"
    job_id: str
    job_queue: str
    quota_share: str


class PreemptionHoldReleased(Message):
    """The capacity held for a preemptor (S4.3) is no longer held."""

    type: Literal["PreemptionHoldReleased"] = "PreemptionHoldReleased"
    job_id: str
    reason: str


class AttemptFenced(Message):
    """A node reported an attempt that the scheduler does not assign to it: the node must stop it."""

    type: Literal["AttemptFenced"] = "AttemptFenced"
    node_id: str
    job_id: str
    attempt_id: str
    reason: str


class NodeRegistered(Message):
    type: Literal["NodeRegistered"] = "NodeRegistered"
    node_id: str
    pool: str
    slots: tuple[SlotOffer, ...]
    draining: bool = False
    """The node registers while an operator's drain holds (its agent restarted): it stays drained."""
    address: str = ""
    """``RegisterNode.address``: how other nodes reach this one (empty: its node id)."""
    incarnation: str = ""
    """``RegisterNode.incarnation``: the registration that ``RunAttempt`` commands are addressed to."""
    training_plan: str | None = None
    """``RegisterNode.training_plan``: its slots are usable only while a window of the plan is open."""


class TrainingPlanChanged(Message):
    type: Literal["TrainingPlanChanged"] = "TrainingPlanChanged"
    spec: TrainingPlanSpec
    status: ResourceStatus = "VALID"


class TrainingPlanWindowOpened(Message):
    """A window of the plan opened (S11): its nodes' slots are usable and its allocations count."""

    type: Literal["TrainingPlanWindowOpened"] = "TrainingPlanWindowOpened"
    plan: str
    start: int
    end: int


class TrainingPlanWindowClosed(Message):
    """The plan's open window closed to new work, ``grace_seconds`` before its end (S11): its nodes'
    slots are no longer offered and its jobs are stopped in the same decision."""

    type: Literal["TrainingPlanWindowClosed"] = "TrainingPlanWindowClosed"
    plan: str
    start: int
    end: int


class NodeHeartbeatRecorded(Message):
    type: Literal["NodeHeartbeatRecorded"] = "NodeHeartbeatRecorded"
    node_id: str


class NodeDraining(Message):
    type: Literal["NodeDraining"] = "NodeDraining"
    node_id: str


class NodeUndrained(Message):
    """A draining node is back in service: its slots count again and it gets new dispatches."""

    type: Literal["NodeUndrained"] = "NodeUndrained"
    node_id: str


class NodeLost(Message):
    """The node is gone (missed heartbeats or deregistered); its attempts were requeued first."""

    type: Literal["NodeLost"] = "NodeLost"
    node_id: str
    reason: str


class NodeLossSuspended(Message):
    """Every online node of ``pool`` went silent at once: it is the link to the scheduler that failed
    (a broker outage), not the nodes, so none of them is declared lost until heartbeats flow again."""

    type: Literal["NodeLossSuspended"] = "NodeLossSuspended"
    pool: str
    reason: str


class NodeLossResumed(Message):
    """A node of a suspended pool was heard from again (``node_id``; decided by the next tick): every
    online node of ``pool`` has its heartbeat timer restarted now, so each gets a whole timeout."""

    type: Literal["NodeLossResumed"] = "NodeLossResumed"
    pool: str
    node_id: str


SchedulerEvent = Annotated[
    InputRejected
    | SchedulingPolicyChanged
    | ServiceEnvironmentChanged
    | JobQueueChanged
    | QuotaShareChanged
    | JobAccepted
    | JobDispatched
    | JobStarting
    | JobRunning
    | JobSucceeded
    | JobFailed
    | JobRequeued
    | JobPreempted
    | JobStopRequested
    | AttemptPartEnded
    | AttemptOutputsRecorded
    | AttemptCheckpointed
    | JobPriorityChanged
    | JobTagsChanged
    | JobBlocked
    | JobUnblocked
    | PreemptionHoldReleased
    | AttemptFenced
    | NodeRegistered
    | NodeHeartbeatRecorded
    | NodeDraining
    | NodeUndrained
    | NodeLost
    | NodeLossSuspended
    | NodeLossResumed
    | TrainingPlanChanged
    | TrainingPlanWindowOpened
    | TrainingPlanWindowClosed,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[SchedulerEvent] = TypeAdapter(SchedulerEvent)
JOB_STATE_EVENTS = (
    JobAccepted,
    JobDispatched,
    JobStarting,
    JobRunning,
    JobSucceeded,
    JobFailed,
    JobRequeued,
)
