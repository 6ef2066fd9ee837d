"""The nodes as the API shows them (``gpuquota nodes``), projected from the scheduler's events.

Part of the read model (``ReadModel.nodes``): registrations, recorded heartbeats, drains and losses,
and where each attempt was placed (``JobDispatched``), which ``gpuquota jobs logs`` needs to find an
attempt's log. Every attempt ever placed is kept (a finished attempt's log is still read), as a
``Placed`` of plain tuples: the event's pydantic ``Placement`` cost about 400 bytes more an attempt, an
eighth of what a finished job cost the read model; node ids and slot tuples, which every placement on
a node repeats, are kept once (another 100 bytes an attempt). Heartbeats are recorded in the log at most every
quarter of the heartbeat timeout, so ``heartbeatAgeSeconds`` can exceed the real age by that much.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpuquota.wire import events as ev
from gpuquota.wire.base import JobStatus, SlotOffer

ACTIVE = (JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING)


class Placed(NamedTuple):
    """A ``Placement`` as kept: its node and the slots and GPUs given there."""

    node_id: str
    slots: tuple[int, ...]
    gpus: tuple[int, ...]


ActiveAttempt = tuple[str, str, JobStatus, str]
"""(job id, job name, status, attempt id) of a job that holds slots."""


@dataclass(slots=True)
class NodeView:
    node_id: str
    pool: str
    slots: tuple[SlotOffer, ...]
    registered_at: int
    last_heartbeat: int
    online: bool = True
    draining: bool = False
    address: str = ""
    """``RegisterNode.address``: how other nodes reach this one (empty: none advertised)."""

    @property
    def state(self) -> str:
        if not self.online:
            return "LOST"
        return "DRAINING" if self.draining else "READY"


class NodeTable:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.placements: dict[str, tuple[Placed, ...]] = {}
        """Attempt id -> the slots it was given, per node."""
        self._tuples: dict[tuple[int, ...], tuple[int, ...]] = {}
        """One of each slot or GPU tuple placed (they repeat with every placement on a node)."""

    def apply(self, event: ev.SchedulerEvent) -> None:
        if isinstance(event, ev.JobDispatched):
            share = self._tuples.setdefault
            self.placements[event.attempt_id] = tuple(
                Placed(sys.intern(p.node_id), share(p.slots, p.slots), share(p.gpus, p.gpus))
                for p in event.placements
            )
        elif isinstance(event, ev.NodeRegistered):
            self.nodes[event.node_id] = NodeView(
                event.node_id,
                event.pool,
                event.slots,
                event.occurred_at,
                event.occurred_at,
                True,
                event.draining,
                event.address,
            )
        elif isinstance(event, ev.NodeLossResumed):
            for view in self.nodes.values():
                if view.pool == event.pool and view.online:
                    view.last_heartbeat = event.occurred_at  # every timer of the pool restarts
        elif isinstance(event, ev.NodeHeartbeatRecorded | ev.NodeDraining | ev.NodeUndrained | ev.NodeLost):
            node = self.nodes.get(event.node_id)
            if node is None:
                return
            if isinstance(event, ev.NodeHeartbeatRecorded):
                node.last_heartbeat = event.occurred_at
            elif isinstance(event, ev.NodeLost):
                node.online = False
            else:
                node.draining = isinstance(event, ev.NodeDraining)

    def nodes_of(self, attempt_id: str) -> tuple[str, ...]:
        """The nodes an attempt ran on (the first holds its log)."""
        return tuple(p.node_id for p in self.placements.get(attempt_id, ()))

    def describe(self, active: Iterable[ActiveAttempt], now: int) -> list[dict[str, Any]]:
        """Every node, by id: advertised address, state, slots per unit (total, used), GPUs, attempts,
        heartbeat age."""
        attempts: dict[str, list[dict[str, Any]]] = {}
        used: dict[str, dict[str, int]] = {}
        for job_id, job_name, status, attempt_id in active:
            for placement in self.placements.get(attempt_id, ()):
                attempts.setdefault(placement.node_id, []).append(
                    {
                        "jobId": job_id,
                        "jobName": job_name,
                        "attemptId": attempt_id,
                        "status": status.value,
                        "slots": list(placement.slots),
                        "gpus": list(placement.gpus),
                    }
                )
                node = self.nodes.get(placement.node_id)
                if node is not None and placement.slots:
                    unit = node.slots[placement.slots[0]].unit
                    counts = used.setdefault(placement.node_id, {})
                    counts[unit] = counts.get(unit, 0) + len(placement.slots)
        return [
            self._row(node, attempts.get(node_id, []), used.get(node_id, {}), now)
            for node_id, node in sorted(self.nodes.items())
        ]

    @staticmethod
    def _row(
        node: NodeView, attempts: list[dict[str, Any]], used: dict[str, int], now: int
    ) -> dict[str, Any]:
        slots: dict[str, int] = {}
        for slot in node.slots:
            slots[slot.unit] = slots.get(slot.unit, 0) + 1
        return {
            "nodeId": node.node_id,
            "address": node.address or None,
            "pool": node.pool,
            "state": node.state,
            "slots": slots,
            "usedSlots": used,
            "gpus": sum(len(slot.gpus) for slot in node.slots),
            "attempts": sorted(attempts, key=lambda a: (a["jobName"], a["jobId"])),
            "registeredAt": node.registered_at,
            "lastHeartbeatAt": node.last_heartbeat,
            "heartbeatAgeSeconds": round(max(0, now - node.last_heartbeat) / 1000, 1),
        }
