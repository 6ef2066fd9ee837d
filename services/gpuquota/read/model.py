"""The read model: what the API shows, projected from the scheduler's events only.

Theory of operation
-------------------
``ReadModel.apply(event)`` folds one decided event into AWS-shaped views of scheduling policies,
service environments, job queues, quota shares and service jobs. Folding the log from an empty read
model rebuilds it exactly; ``gpuquota.read.projection.Projector`` feeds it, in both modes. Each job
is kept compact (``gpuquota.read.jobs``): the read model keeps every job it ever saw.

Besides the projection, the gateway records *pending* states when it sends a command (a share it is
creating is ``CREATING``, a job it submitted is ``SUBMITTED``), so a Describe right after a write never
says "does not exist"; the event that follows replaces the pending state (``VALID``, ``RUNNABLE``), and
a rejection removes it (``revert``). Pending states are not durable: they only bridge the gap between
a write and its event.

Everything here is plain data and dictionaries; ``gpuquota.gateway.render`` renders the AWS response
shapes from these views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic.alias_generators import to_camel
from sortedcontainers import SortedList

from gpuquota.core.records import QueueKey
from gpuquota.read.jobs import AttemptView, JobView, ShareKey
from gpuquota.read.nodes import NodeTable
from gpuquota.read.plans import PlanTable
from gpuquota.read.tally import EventTally
from gpuquota.support.arns import ArnFactory
from gpuquota.wire import events as ev
from gpuquota.wire.base import (
    JobQueueSpec,
    JobSpec,
    JobStatus,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
)

S = TypeVar("S", SchedulingPolicySpec, ServiceEnvironmentSpec, JobQueueSpec, QuotaShareSpec)

RECENT_PREEMPTIONS = 10
"""How many preempted attempts ``preemptionSummary.recentPreemptedAttempts`` keeps (newest first)."""
RunnableKey = QueueKey

_HANDLERS: dict[str, str] = {}
"""Event type -> the name of its ``ReadModel._on_*`` method (built once per type, not per event)."""


@dataclass
class ResourceView(Generic[S]):
    spec: S
    status: str = "VALID"
    status_reason: str | None = None
    pending_input: str | None = None
    """The event id of the command that made this view pending (``None`` once an event confirmed it)."""
    previous: ResourceView[S] | None = None
    """While pending: the view before that command, restored if the command is rejected."""


class ReadModel:
    """AWS-shaped views built from scheduler events (see the module docstring)."""

    def __init__(self, arns: ArnFactory | None = None) -> None:
        self.arns = arns or ArnFactory()
        self.reset()

    def reset(self) -> None:
        """Forget everything (before folding the log again)."""
        self.policies: dict[str, ResourceView[SchedulingPolicySpec]] = {}
        self.environments: dict[str, ResourceView[ServiceEnvironmentSpec]] = {}
        self.queues: dict[str, ResourceView[JobQueueSpec]] = {}
        self.shares: dict[ShareKey, ResourceView[QuotaShareSpec]] = {}
        self.jobs: dict[str, JobView] = {}
        self.runnable: dict[ShareKey, SortedList[RunnableKey]] = {}
        """Per share, its RUNNABLE jobs in the core's scheduling order (``core.records.queue_order``)."""
        self.usage: dict[ShareKey, dict[str, int]] = {}
        """Per share and unit: instances held by SCHEDULED, STARTING and RUNNING jobs."""
        self.client_tokens: dict[str, tuple[str, str]] = {}
        """SubmitServiceJob ``clientToken`` -> (fingerprint of the request, job id)."""
        self.last_event_at = 0
        self.tally = EventTally()
        """Counters of the applied events (Prometheus, ``gpuquota.read.tally``)."""
        self.nodes = NodeTable()
        self.plans = PlanTable()
        """Training plans, their open windows and GPU-hours (``gpuquota plans``, S11)."""
        """Nodes and where each attempt was placed (``gpuquota nodes``, ``gpuquota jobs logs``)."""
        self.head_since: dict[ShareKey, tuple[str, int]] = {}
        """Per share: its first RUNNABLE job and since when it is first (``earliestTimeAtPosition``)."""

    def adopt(self, other: ReadModel) -> None:
        """Take over ``other``'s views: a projection rebuilt from the log, swapped in place so that
        every holder of this read model sees it (``gateway.log_tail``)."""
        vars(self).update(vars(other))

    # ----- projection --------------------------------------------------------------------------

    def apply(self, event: ev.SchedulerEvent) -> None:
        """Fold one event (``read.projection.Projector`` feeds it and keeps its errors)."""
        if event.occurred_at > self.last_event_at:
            self.last_event_at = event.occurred_at
        self.nodes.apply(event)
        self.plans.apply(event)
        name = _HANDLERS.get(event.type)
        if name is None:
            name = _HANDLERS[event.type] = f"_on_{event.type}"
        handler = getattr(self, name, None)
        if handler is None:
            return
        job_id = event.job.job_id if isinstance(event, ev.JobAccepted) else getattr(event, "job_id", None)
        before = self.jobs.get(job_id) if isinstance(job_id, str) else None
        status = None if before is None or before.pending_input is not None else before.status
        handler(event)
        job = self.jobs.get(job_id) if isinstance(job_id, str) else None
        self.tally.observe(event, job)
        if job is not None and job.status is not status:
            job.note_status(event.occurred_at)

    def _resource(self, table: dict[Any, ResourceView[S]], key: Any, spec: S, status: str) -> None:
        if status == "DELETED":
            table.pop(key, None)
        else:
            table[key] = ResourceView(spec, status)

    def _on_SchedulingPolicyChanged(self, e: ev.SchedulingPolicyChanged) -> None:
        self._resource(self.policies, e.spec.name, e.spec, e.status)

    def _on_ServiceEnvironmentChanged(self, e: ev.ServiceEnvironmentChanged) -> None:
        self._resource(self.environments, e.spec.name, e.spec, e.status)

    def _on_JobQueueChanged(self, e: ev.JobQueueChanged) -> None:
        self._resource(self.queues, e.spec.name, e.spec, e.status)

    def _on_QuotaShareChanged(self, e: ev.QuotaShareChanged) -> None:
        key = (e.spec.job_queue, e.spec.name)
        self._resource(self.shares, key, e.spec, e.status)
        if e.status == "DELETED":
            self.runnable.pop(key, None)
            self.usage.pop(key, None)

    def _on_InputRejected(self, e: ev.InputRejected) -> None:
        if e.job_id is not None:
            job = self.jobs.get(e.job_id)
            if job is not None and job.pending_input == e.input_event_id:
                del self.jobs[e.job_id]
            return
        # A rejected resource command: restore the view its pending state replaced. The gateway does
        # the same when it sees the rejection in time; a rejection that arrives after the gateway
        # stopped waiting for it (distributed mode, a slow scheduler) is only seen here.
        tables: tuple[dict[Any, ResourceView[Any]], ...] = (
            self.policies,
            self.environments,
            self.queues,
            self.shares,
        )
        for table in tables:
            for key, view in table.items():
                if view.pending_input is not None and self._unmark(table, key, e.input_event_id):
                    return

    def _on_JobAccepted(self, e: ev.JobAccepted) -> None:
        job = self.jobs.get(e.job.job_id)
        if job is not None and job.pending_input is not None:
            # The gateway's pending view becomes the job's view: nothing but its tags (TagResource)
            # changes while it is pending, and those are kept.
            job.spec = e.job
            job.priority = e.job.priority
            job.pending_input = None
        else:
            job = JobView(e.job, e.job.priority, dict(e.job.tags))
            self.jobs[job.job_id] = job
        job.status = JobStatus.RUNNABLE
        job.runnable_since = e.occurred_at
        self._enqueue(job)
        if e.job.client_token is not None:
            self.client_tokens[e.job.client_token] = (e.job.request_digest, e.job.job_id)

    def _enqueue(self, job: JobView) -> None:
        queue = self.runnable.get(job.share)
        if queue is None:
            queue = self.runnable[job.share] = SortedList()
        queue.add(job.runnable_key)
        self._note_head(job.share)

    def _dequeue(self, job: JobView) -> None:
        queue = self.runnable.get(job.share)
        if queue is not None and job.runnable_key in queue:
            queue.remove(job.runnable_key)
            self._note_head(job.share)

    def _note_head(self, share: ShareKey) -> None:
        keys = self.runnable.get(share)
        head = keys[0][2] if keys else None
        current = self.head_since.get(share)
        if head is None:
            self.head_since.pop(share, None)
        elif current is None or current[0] != head:
            self.head_since[share] = (head, self.last_event_at)

    def time_at_position(self, job: JobView) -> int:
        """When the job reached its place: the front of its share if it is there, else RUNNABLE."""
        since = self.head_since.get(job.share)
        if since is not None and since[0] == job.job_id:
            return max(since[1], job.runnable_since)
        return job.runnable_since

    def _release(self, job: JobView) -> None:
        if job.held is not None:
            unit, count = job.held
            usage = self.usage.setdefault(job.share, {})
            usage[unit] = usage.get(unit, 0) - count
            job.held = None

    def _close_attempt(self, job: JobView, at: int, reason: str | None) -> AttemptView | None:
        attempt = job.current
        if attempt is not None:
            attempt.stopped_at = at
            attempt.status_reason = reason
            job.current = None
        return attempt

    def _on_JobDispatched(self, e: ev.JobDispatched) -> None:
        job = self.jobs[e.job_id]
        self._dequeue(job)
        job.status = JobStatus.SCHEDULED
        job.status_reason = None
        job.blocked_reason = None
        job.scheduled_at = e.occurred_at
        job.stopped_at = None
        job.start_attempt(AttemptView(e.attempt_id, e.occurred_at))
        job.held = (e.unit, e.count)
        usage = self.usage.setdefault(job.share, {})
        usage[e.unit] = usage.get(e.unit, 0) + e.count

    def _on_AttemptOutputsRecorded(self, e: ev.AttemptOutputsRecorded) -> None:
        if (attempt := self.jobs[e.job_id].current) is not None:  # recorded before the attempt ends
            node = {"nodeId": e.node_id}
            attempt.outputs += tuple(
                node | {"host": o.host, "modelDir": o.model_dir, "outputDir": o.output_dir} for o in e.outputs
            )

    def _on_AttemptCheckpointed(self, e: ev.AttemptCheckpointed) -> None:
        if (attempt := self.jobs[e.job_id].current) is not None and attempt.attempt_id == e.attempt_id:
            attempt.checkpoint_at = e.checkpoint_at

    def _on_JobStarting(self, e: ev.JobStarting) -> None:
        self.jobs[e.job_id].status = JobStatus.STARTING

    def _on_JobRunning(self, e: ev.JobRunning) -> None:
        job = self.jobs[e.job_id]
        job.status = JobStatus.RUNNING
        job.started_at = e.occurred_at
        if job.current is not None:
            job.current.started_at = e.occurred_at

    def _on_JobSucceeded(self, e: ev.JobSucceeded) -> None:
        job = self.jobs[e.job_id]
        if job.status is JobStatus.RUNNABLE:  # a success the log had lost, adopted (core.lost_tail)
            self._dequeue(job)
        self._release(job)
        self._close_attempt(job, e.occurred_at, e.status_reason)
        job.status = JobStatus.SUCCEEDED
        job.status_reason = e.status_reason
        job.stopped_at = e.occurred_at

    def _on_JobFailed(self, e: ev.JobFailed) -> None:
        job = self.jobs[e.job_id]
        if job.status is JobStatus.RUNNABLE:
            self._dequeue(job)
        self._release(job)
        attempt = self._close_attempt(job, e.occurred_at, e.status_reason)
        if e.preempted and attempt is not None:
            self._preempted(job, attempt)
        job.status = JobStatus.FAILED
        job.status_reason = e.status_reason
        job.is_terminated = job.is_terminated or e.is_terminated
        job.stopped_at = e.occurred_at

    def _preempted(self, job: JobView, attempt: AttemptView) -> None:
        job.preempted_count += 1
        job.recent_preempted = (attempt, *job.recent_preempted)[:RECENT_PREEMPTIONS]

    def _on_JobRequeued(self, e: ev.JobRequeued) -> None:
        job = self.jobs[e.job_id]
        self._release(job)
        attempt = self._close_attempt(job, e.occurred_at, e.status_reason)
        if e.cause == "PREEMPTED" and attempt is not None:
            self._preempted(job, attempt)
        job.status = JobStatus.RUNNABLE
        job.status_reason = e.status_reason
        job.runnable_since = e.occurred_at
        job.started_at = None
        self._enqueue(job)

    def _on_JobPreempted(self, e: ev.JobPreempted) -> None:
        job = self.jobs.get(e.job_id)
        if job is None:
            return
        preemptor = self.jobs.get(e.preemptor_job_id)
        if job.current is not None and job.current.attempt_id == e.attempt_id:
            job.current.lost_work = lost_work(e)
        decision = {
            "decidedAt": e.occurred_at,
            "attemptId": e.attempt_id,
            "kind": e.kind,
            "preemptorJobId": e.preemptor_job_id or None,
            "preemptorJobName": None if preemptor is None else preemptor.job_name,
            "preemptorQuotaShareName": e.preemptor_share,
            "victimQuotaShareName": e.victim_share,
            "statusReason": e.status_reason,
            "victimRuntimeMs": e.victim_runtime_ms,
            "lostWork": lost_work(e),
            "figures": {to_camel(k): v for k, v in e.figures.model_dump().items()},
        }
        job.preemptions = (decision, *job.preemptions)[:RECENT_PREEMPTIONS]

    def _on_JobTagsChanged(self, e: ev.JobTagsChanged) -> None:
        job = self.jobs.get(e.job_id)
        if job is not None:
            job.tags = dict(e.tags)

    def _on_JobBlocked(self, e: ev.JobBlocked) -> None:
        if (job := self.jobs.get(e.job_id)) is not None:
            job.blocked_reason = e.status_reason

    def _on_JobUnblocked(self, e: ev.JobUnblocked) -> None:
        if (job := self.jobs.get(e.job_id)) is not None:
            job.blocked_reason = None

    def _on_JobPriorityChanged(self, e: ev.JobPriorityChanged) -> None:
        job = self.jobs[e.job_id]
        if job.status is JobStatus.RUNNABLE:
            self._dequeue(job)
            job.priority = e.priority
            self._enqueue(job)
        else:
            job.priority = e.priority

    # ----- pending states (recorded by the gateway when it sends a command) ---------------------

    def pending_job(self, spec: JobSpec, input_id: str) -> JobView:
        job = JobView(spec, spec.priority, dict(spec.tags), pending_input=input_id)
        job.runnable_since = spec.created_at
        self.jobs[job.job_id] = job
        return job

    def revert_job(self, job_id: str, input_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.pending_input == input_id and job.status is JobStatus.SUBMITTED:
            del self.jobs[job_id]

    def mark(self, table: dict[Any, ResourceView[S]], key: Any, spec: S, status: str, input_id: str) -> None:
        """Record a pending status (it keeps the view it replaces, for ``revert`` on rejection)."""
        previous = table.get(key)
        if previous is None:
            table[key] = ResourceView(spec, status, pending_input=input_id)
        else:
            table[key] = ResourceView(
                previous.spec, status, previous.status_reason, pending_input=input_id, previous=previous
            )

    def revert(self, table: dict[Any, ResourceView[S]], key: Any, input_id: str) -> None:
        """Undo the pending state of a rejected command (nothing if an event already replaced it)."""
        self._unmark(table, key, input_id)

    @staticmethod
    def _unmark(table: dict[Any, ResourceView[S]], key: Any, input_id: str) -> bool:
        """Remove the pending state of ``input_id`` from ``key``'s chain of pending views."""
        later: ResourceView[S] | None = None
        view = table.get(key)
        while view is not None and view.pending_input is not None:
            if view.pending_input == input_id:
                if later is not None:
                    later.previous = view.previous  # a later command is pending on top of this one
                elif view.previous is None:
                    del table[key]
                else:
                    table[key] = view.previous
                return True
            later, view = view, view.previous
        return False


def lost_work(e: ev.JobPreempted) -> dict[str, Any]:
    """S12: what a preemption threw away, as ``gpuquotaLostWork`` shows it (seconds per instance, and
    times the attempt's GPUs)."""
    seconds = e.lost_ms / 1000
    return {"kind": e.kind, "seconds": seconds, "gpus": e.lost_gpus, "gpuSeconds": seconds * e.lost_gpus}
