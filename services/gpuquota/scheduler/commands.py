"""Derive node commands from decided events (used by the scheduler loop, in both modes)."""

from __future__ import annotations

from typing import Any

from gpuquota.core.state import ClusterState, JobRecord
from gpuquota.wire import events as ev
from gpuquota.wire.base import Placement
from gpuquota.wire.node_commands import GangNode, NodeCommand, RegisterAgain, RunAttempt, StopAttempt


def gang(state: ClusterState, placements: tuple[Placement, ...]) -> tuple[GangNode, ...]:
    """The nodes of an attempt in rank order (placement order), with their addresses; empty for one node."""
    if len(placements) < 2:
        return ()
    nodes, rank = [], 0
    for p in placements:
        node = state.nodes.get(p.node_id)
        address = (node.address if node is not None else "") or p.node_id
        nodes.append(GangNode(node_id=p.node_id, instances=len(p.slots), first_rank=rank, address=address))
        rank += len(p.slots)
    return tuple(nodes)


def _incarnation(state: ClusterState, node_id: str) -> str:
    """The registration a ``RunAttempt`` is addressed to (its agent drops it after a newer one)."""
    node = state.nodes.get(node_id)
    return "" if node is None else node.incarnation


def _header(event: ev.SchedulerEvent, node_id: str, *, part: bool = False) -> dict[str, Any]:
    """What a command derived from ``event`` takes from it: its time, and its id (with the node's for
    one part of a per-node fan-out, so that each part's id is its own)."""
    event_id = f"{event.event_id}/{node_id}" if part else event.event_id
    return {"event_id": event_id, "occurred_at": event.occurred_at, "node_id": node_id}


def _running_parts(job: JobRecord) -> list[str]:
    """The nodes of the job's attempt whose part has not ended."""
    over = {node for node, _ in job.parts_over}
    return [p.node_id for p in job.placements if p.node_id not in over]


def node_commands(state: ClusterState, event: ev.SchedulerEvent) -> list[NodeCommand]:
    """The commands node agents must receive for ``event``; call it *before* evolving ``event``."""
    if isinstance(event, ev.JobDispatched):
        job = state.jobs[event.job_id]
        nodes = gang(state, event.placements)
        return [
            RunAttempt(
                **_header(event, p.node_id, part=True),
                job_id=event.job_id,
                job_name=job.job_name,
                attempt_id=event.attempt_id,
                attempt_number=event.attempt_number,
                unit=event.unit,
                slots=p.slots,
                gpus=p.gpus,
                payload=job.payload,
                gang=nodes,
                incarnation=_incarnation(state, p.node_id),
            )
            for p in event.placements
        ]
    if isinstance(event, ev.JobPreempted | ev.JobStopRequested | ev.JobRequeued | ev.JobFailed):
        return _stop_parts(state, event)
    if isinstance(event, ev.AttemptFenced):
        return [
            StopAttempt(
                **_header(event, event.node_id),
                job_id=event.job_id,
                attempt_id=event.attempt_id,
                reason=event.reason,
            )
        ]
    if isinstance(event, ev.InputRejected) and event.input_type == "NodeHeartbeat" and event.node_id:
        # the node is unknown or was declared lost while its agent kept running (S5.7)
        return [RegisterAgain(**_header(event, event.node_id), reason=event.reason)]
    return []


def _stop_parts(
    state: ClusterState, event: ev.JobPreempted | ev.JobStopRequested | ev.JobRequeued | ev.JobFailed
) -> list[NodeCommand]:
    """A stop of the job's attempt goes to every node whose part still runs. An attempt of a job placed on
    several nodes that ends (a node was lost, say) while parts of it may still run elsewhere: those are
    stopped at once, before their slots are given to another attempt."""
    job = state.jobs.get(event.job_id)
    attempt_id = event.attempt_id
    if job is None or attempt_id is None or job.attempt_id != attempt_id:
        return []
    if isinstance(event, ev.JobRequeued | ev.JobFailed) and len(job.placements) < 2:
        return []
    return [
        StopAttempt(
            **_header(event, node_id, part=True),
            job_id=event.job_id,
            attempt_id=attempt_id,
            reason=event.status_reason,
            grace_seconds=event.grace_seconds if isinstance(event, ev.JobPreempted) else None,
        )
        for node_id in _running_parts(job)
    ]
