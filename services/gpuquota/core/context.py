"""The working context of one ``decide`` call: the state under trial, the clock, and emitted events.

The context also tracks which capacity units an input touched (``dirty``). Units are independent
(every quota figure is per unit), so the scheduling pass after an input only needs to revisit the
heads whose unit changed: a freed slot of ``ml.g5.xlarge`` cannot let an ``ml.p4d.24xlarge`` job run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast, overload

from gpuquota.core.evolve import evolve
from gpuquota.core.state import RUNNABLE, ClusterState, ShareKey, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire.base import (
    JobQueueSpec,
    JobSpec,
    Message,
    Placement,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    TrainingPlanSpec,
)
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.fast_construct import fast_construct
from gpuquota.wire.inputs import InstanceOutput

E = TypeVar("E", bound=Message)
DispatchPhase = Literal["IN_QUOTA", "BORROW", "HOLD"]
EventHook = Callable[[ClusterState, SchedulerEvent], None]
"""Called with each event just before it is applied (``step``): the state it changes, as it was."""

# How an event touches units (``Context._touch``), by event type; every other event is about a job.
_CONFIGURATION, _NEW_NODE, _OLD_NODE, _HOLD, _NEW_JOB, _BY_JOB = "config", "new", "old", "hold", "job", "by"
_TOUCH_KIND: dict[type[Any], str] = {
    ev.SchedulingPolicyChanged: _CONFIGURATION,
    ev.ServiceEnvironmentChanged: _CONFIGURATION,
    ev.JobQueueChanged: _CONFIGURATION,
    ev.QuotaShareChanged: _CONFIGURATION,
    ev.TrainingPlanChanged: _CONFIGURATION,
    ev.TrainingPlanWindowOpened: _CONFIGURATION,
    ev.TrainingPlanWindowClosed: _CONFIGURATION,
    ev.NodeRegistered: _NEW_NODE,
    ev.NodeDraining: _OLD_NODE,
    ev.NodeUndrained: _OLD_NODE,
    ev.NodeLost: _OLD_NODE,
    ev.PreemptionHoldReleased: _HOLD,
    ev.JobAccepted: _NEW_JOB,
}


class Context:
    """Collects the events of one input, applying each as it is emitted so later choices see it."""

    __slots__ = ("before", "dirty", "events", "input_id", "now", "state")

    def __init__(self, state: ClusterState, input_id: str, now: int, before: EventHook | None = None) -> None:
        self.before = before
        self.state = state
        self.input_id = input_id
        self.now = now
        self.events: list[SchedulerEvent] = []
        self.dirty: set[str] | None = set()
        """Units whose figures or heads changed; ``None`` means every unit."""

    # Typed construction: one signature per event type, checked by mypy at every ``emit`` (the fields
    # of the wire model, without the ids and time ``emit`` adds); at run time only the one below exists.
    # They stay because ``emit`` validates nothing (``fast_construct``) and a generic ``type[E]``
    # signature would check only the returned type; tests/unit/core/test_emit_signatures.py keeps
    # them equal to the wire models.
    @overload
    def emit(
        self,
        event_type: type[ev.InputRejected],
        *,
        input_event_id: str,
        input_type: str,
        reason: str,
        job_id: str | None = ...,
        node_id: str | None = ...,
    ) -> ev.InputRejected: ...

    @overload
    def emit(
        self,
        event_type: type[ev.SchedulingPolicyChanged],
        *,
        spec: SchedulingPolicySpec,
        status: Literal["VALID", "DELETING", "DELETED"] = ...,
    ) -> ev.SchedulingPolicyChanged: ...

    @overload
    def emit(
        self,
        event_type: type[ev.ServiceEnvironmentChanged],
        *,
        spec: ServiceEnvironmentSpec,
        status: Literal["VALID", "DELETING", "DELETED"] = ...,
    ) -> ev.ServiceEnvironmentChanged: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobQueueChanged],
        *,
        spec: JobQueueSpec,
        status: Literal["VALID", "DELETING", "DELETED"] = ...,
    ) -> ev.JobQueueChanged: ...

    @overload
    def emit(
        self,
        event_type: type[ev.QuotaShareChanged],
        *,
        spec: QuotaShareSpec,
        status: Literal["VALID", "DELETING", "DELETED"] = ...,
    ) -> ev.QuotaShareChanged: ...

    @overload
    def emit(self, event_type: type[ev.JobAccepted], *, job: JobSpec) -> ev.JobAccepted: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobDispatched],
        *,
        job_id: str,
        attempt_id: str,
        attempt_number: int,
        unit: str,
        count: int,
        placements: tuple[Placement, ...],
        phase: Literal["IN_QUOTA", "BORROW", "HOLD"],
        borrowed: int,
    ) -> ev.JobDispatched: ...

    @overload
    def emit(self, event_type: type[ev.JobStarting], *, job_id: str, attempt_id: str) -> ev.JobStarting: ...

    @overload
    def emit(self, event_type: type[ev.JobRunning], *, job_id: str, attempt_id: str) -> ev.JobRunning: ...

    @overload
    def emit(
        self, event_type: type[ev.JobSucceeded], *, job_id: str, attempt_id: str, status_reason: str = ...
    ) -> ev.JobSucceeded: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobFailed],
        *,
        job_id: str,
        attempt_id: str | None = ...,
        status_reason: str,
        is_terminated: bool = ...,
        preempted: bool = ...,
    ) -> ev.JobFailed: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobRequeued],
        *,
        job_id: str,
        attempt_id: str,
        cause: Literal["RETRY", "PREEMPTED", "NODE_LOST", "HANDED_BACK"],
        status_reason: str,
    ) -> ev.JobRequeued: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobPreempted],
        *,
        job_id: str,
        attempt_id: str,
        preemptor_job_id: str,
        preemptor_share: str,
        victim_share: str,
        kind: ev.PreemptionKind,
        status_reason: str,
        figures: ev.PreemptionFigures,
        victim_runtime_ms: int = ...,
        lost_ms: int = ...,
        lost_gpus: int = ...,
        grace_seconds: float | None = ...,
    ) -> ev.JobPreempted: ...

    @overload
    def emit(
        self,
        event_type: type[ev.TrainingPlanChanged],
        *,
        spec: TrainingPlanSpec,
        status: ev.ResourceStatus = ...,
    ) -> ev.TrainingPlanChanged: ...

    @overload
    def emit(
        self, event_type: type[ev.TrainingPlanWindowOpened], *, plan: str, start: int, end: int
    ) -> ev.TrainingPlanWindowOpened: ...

    @overload
    def emit(
        self, event_type: type[ev.TrainingPlanWindowClosed], *, plan: str, start: int, end: int
    ) -> ev.TrainingPlanWindowClosed: ...

    @overload
    def emit(
        self, event_type: type[ev.AttemptCheckpointed], *, job_id: str, attempt_id: str, checkpoint_at: int
    ) -> ev.AttemptCheckpointed: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobStopRequested],
        *,
        job_id: str,
        attempt_id: str,
        cause: ev.StopCause,
        status_reason: str,
    ) -> ev.JobStopRequested: ...

    @overload
    def emit(
        self,
        event_type: type[ev.AttemptPartEnded],
        *,
        job_id: str,
        attempt_id: str,
        node_id: str,
        status: Literal["SUCCEEDED", "FAILED", "STOPPED"],
        status_reason: str | None = ...,
    ) -> ev.AttemptPartEnded: ...

    @overload
    def emit(
        self,
        event_type: type[ev.AttemptOutputsRecorded],
        *,
        job_id: str,
        attempt_id: str,
        node_id: str,
        outputs: tuple[InstanceOutput, ...],
    ) -> ev.AttemptOutputsRecorded: ...

    @overload
    def emit(
        self, event_type: type[ev.JobPriorityChanged], *, job_id: str, priority: int
    ) -> ev.JobPriorityChanged: ...

    @overload
    def emit(
        self, event_type: type[ev.JobTagsChanged], *, job_id: str, tags: dict[str, str]
    ) -> ev.JobTagsChanged: ...

    @overload
    def emit(
        self,
        event_type: type[ev.JobBlocked],
        *,
        job_id: str,
        job_queue: str,
        quota_share: str,
        code: Literal[
            "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE",
            "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
            "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
        ],
        status_reason: str,
    ) -> ev.JobBlocked: ...

    @overload
    def emit(
        self, event_type: type[ev.JobUnblocked], *, job_id: str, job_queue: str, quota_share: str
    ) -> ev.JobUnblocked: ...

    @overload
    def emit(
        self, event_type: type[ev.PreemptionHoldReleased], *, job_id: str, reason: str
    ) -> ev.PreemptionHoldReleased: ...

    @overload
    def emit(
        self, event_type: type[ev.AttemptFenced], *, node_id: str, job_id: str, attempt_id: str, reason: str
    ) -> ev.AttemptFenced: ...

    @overload
    def emit(
        self,
        event_type: type[ev.NodeRegistered],
        *,
        node_id: str,
        pool: str,
        slots: tuple[SlotOffer, ...],
        draining: bool = ...,
        address: str = ...,
        incarnation: str = ...,
        training_plan: str | None = ...,
    ) -> ev.NodeRegistered: ...

    @overload
    def emit(
        self, event_type: type[ev.NodeHeartbeatRecorded], *, node_id: str
    ) -> ev.NodeHeartbeatRecorded: ...

    @overload
    def emit(self, event_type: type[ev.NodeDraining], *, node_id: str) -> ev.NodeDraining: ...

    @overload
    def emit(self, event_type: type[ev.NodeUndrained], *, node_id: str) -> ev.NodeUndrained: ...

    @overload
    def emit(self, event_type: type[ev.NodeLost], *, node_id: str, reason: str) -> ev.NodeLost: ...

    @overload
    def emit(
        self, event_type: type[ev.NodeLossSuspended], *, pool: str, reason: str
    ) -> ev.NodeLossSuspended: ...

    @overload
    def emit(
        self, event_type: type[ev.NodeLossResumed], *, pool: str, node_id: str
    ) -> ev.NodeLossResumed: ...

    def emit(self, event_type: type[E], **fields: Any) -> E:
        """Create the event (ids derive from the input's id: ``<input id>/<n>``), apply it, keep it."""
        # The core builds events from validated inputs and its own state, so they skip validation
        # (the tests round-trip every event type through JSON to keep this honest; the gain:
        # ``gpuquota.wire.fast_construct``).
        fields["event_id"] = f"{self.input_id}/{len(self.events)}"
        fields["occurred_at"] = self.now
        event = fast_construct(event_type, fields)
        recorded = cast(SchedulerEvent, event)
        key = self._touch(recorded)
        share = self.state.shares.get(key) if key is not None else None
        head_before = None if share is None or share.head_since is None else share.head_since[0]
        blocked_unit = self._blocked_unit(share)
        if self.before is not None:
            self.before(self.state, recorded)
        evolve(self.state, recorded)
        if share is not None and self.dirty is not None:
            head = self.state.head(share)
            if head is not None and head.job_id != head_before:
                self.dirty.add(head.unit)
            if blocked_unit is not None and (head is None or head.job_id != head_before):
                self.dirty.add(blocked_unit)  # the pass records that the blocked head left (S9.1)
        self.events.append(recorded)
        return event

    def _blocked_unit(self, share: ShareRecord | None) -> str | None:
        """The unit of the share's head recorded as blocked, if any (before an event moves it)."""
        if share is None or share.blocked is None:
            return None
        job = self.state.jobs.get(share.blocked[0])
        return None if job is None else job.unit

    def touch_all(self) -> None:
        self.dirty = None

    def _touch(self, event: SchedulerEvent) -> ShareKey | None:
        """Mark the units ``event`` changes; return the share whose head it may change.

        Capacity of a unit changes with dispatches, releases, nodes and configuration. A queued job
        matters only if it becomes its share's head, which ``emit`` checks after applying the event.
        """
        state, dirty = self.state, self.dirty
        kind = _TOUCH_KIND.get(type(event), _BY_JOB)
        if kind == _CONFIGURATION:
            self.dirty = None
        elif dirty is None:
            pass
        elif kind == _NEW_NODE:
            dirty.update(slot.unit for slot in cast(ev.NodeRegistered, event).slots)
        elif kind == _OLD_NODE:
            node_id = cast(ev.NodeDraining | ev.NodeUndrained | ev.NodeLost, event).node_id
            dirty.update(slot.unit for slot in state.nodes[node_id].slots)
        elif kind == _HOLD:
            dirty.add(state.holds[cast(ev.PreemptionHoldReleased, event).job_id].unit)
        elif kind == _NEW_JOB:
            job_spec = cast(ev.JobAccepted, event).job
            return (job_spec.job_queue, job_spec.quota_share)
        else:
            job_id = getattr(event, "job_id", None)
            job = state.jobs.get(job_id) if job_id is not None else None
            if job is None:
                return None
            # A dispatched job's change moves capacity or victim order; a queued job's priority change
            # matters to in-share preemption even when it was and stays the head.
            moves = isinstance(event, ev.JobDispatched | ev.JobPriorityChanged)
            if job.status is not RUNNABLE or moves:
                dirty.add(job.unit)
            return job.share
        return None
