"""Derive node commands from decided events (used by the scheduler loop, in both modes)."""

from __future__ import annotations

from gpuquota.core.state import ClusterState
from gpuquota.wire import events as ev
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt, StopAttempt


def node_commands(state: ClusterState, event: ev.SchedulerEvent) -> list[NodeCommand]:
    """The commands node agents must receive for ``event``; call it *before* evolving ``event``."""
    if isinstance(event, ev.JobDispatched):
        job = state.jobs[event.job_id]
        return [
            RunAttempt(
                event_id=f"{event.event_id}/{p.node_id}",
                occurred_at=event.occurred_at,
                node_id=p.node_id,
                job_id=event.job_id,
                job_name=job.job_name,
                attempt_id=event.attempt_id,
                attempt_number=event.attempt_number,
                unit=event.unit,
                slots=p.slots,
                gpus=p.gpus,
                payload=job.payload,
            )
            for p in event.placements
        ]
    if isinstance(event, ev.JobPreempted | ev.JobStopRequested):
        job = state.jobs[event.job_id]
        return [
            StopAttempt(
                event_id=f"{event.event_id}/{p.node_id}",
                occurred_at=event.occurred_at,
                node_id=p.node_id,
                job_id=event.job_id,
                attempt_id=event.attempt_id,
                reason=event.status_reason,
            )
            for p in job.placements
        ]
    if isinstance(event, ev.AttemptFenced):
        return [
            StopAttempt(
                event_id=event.event_id,
                occurred_at=event.occurred_at,
                node_id=event.node_id,
                job_id=event.job_id,
                attempt_id=event.attempt_id,
                reason=event.reason,
            )
        ]
    if isinstance(event, ev.InputRejected) and event.input_type == "NodeHeartbeat" and event.node_id:
        # the node is unknown or was declared lost while its agent kept running (S5.7)
        return [
            RegisterAgain(
                event_id=event.event_id,
                occurred_at=event.occurred_at,
                node_id=event.node_id,
                reason=event.reason,
            )
        ]
    return []
