"""Training plans as the API shows them (``gpuquota plans``, S11), projected from the scheduler's events.

Part of the read model (``ReadModel.plans``). Besides each plan's spec and its open window, it keeps
the plan's GPU-hours so far, from the log alone (so a replay gives the same figures):

- **capacity**: while a window is open to work (from its ``TrainingPlanWindowOpened`` to its
  ``TrainingPlanWindowClosed``), the plan's ``count`` instances times the GPUs of one instance of its
  nodes (one without a node, or for a slot that lists none);
- **used**: the GPUs of attempts placed on the plan's nodes, from their dispatch (or the window's
  opening) to the end of their attempt (or the window's closing);
- **idle**: capacity less used, never below zero (a plan's nodes may offer more than its ``count``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuquota.wire import events as ev
from gpuquota.wire.base import TrainingPlanSpec

HOUR_MS = 3_600_000


@dataclass(slots=True)
class PlanView:
    spec: TrainingPlanSpec
    open: tuple[int, int] | None = None
    """(start, end) of the window open to work now; ``None``: none is."""
    opened_at: int = 0
    capacity_ms: int = 0
    """GPU-milliseconds the plan offered in its windows so far (closed windows)."""
    used_ms: int = 0
    """GPU-milliseconds attempts on its nodes used in its windows so far (ended or cut at a close)."""


@dataclass(slots=True)
class PlanTable:
    plans: dict[str, PlanView] = field(default_factory=dict)
    node_plan: dict[str, str] = field(default_factory=dict)
    """Node id -> the plan it registered for."""
    node_gpus: dict[str, int] = field(default_factory=dict)
    """Node id -> GPUs of one of its slots (1 when a slot lists none)."""
    running: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Job id -> (plan, GPUs on the plan's nodes, counted since) of attempts placed on a plan's nodes."""

    def apply(self, event: ev.SchedulerEvent) -> None:
        if isinstance(event, ev.TrainingPlanChanged):
            self._changed(event)
        elif isinstance(event, ev.TrainingPlanWindowOpened):
            view = self.plans.get(event.plan)
            if view is not None:
                if view.open is not None:
                    self._flush(event.plan, event.occurred_at)  # the open window got another end
                else:
                    view.opened_at = event.occurred_at
                    self._restart(event.plan, event.occurred_at)
                view.open = (event.start, event.end)
        elif isinstance(event, ev.TrainingPlanWindowClosed):
            view = self.plans.get(event.plan)
            if view is not None and view.open is not None:
                self._flush(event.plan, event.occurred_at)
                view.capacity_ms += (
                    (event.occurred_at - view.opened_at) * self.instance_gpus(event.plan) * (view.spec.count)
                )
                view.open = None
        elif isinstance(event, ev.NodeRegistered):
            if event.training_plan is None:
                self.node_plan.pop(event.node_id, None)
            else:
                self.node_plan[event.node_id] = event.training_plan
                self.node_gpus[event.node_id] = max(1, len(event.slots[0].gpus)) if event.slots else 1
        elif isinstance(event, ev.JobDispatched):
            self._dispatched(event)
        elif isinstance(event, ev.JobSucceeded | ev.JobFailed | ev.JobRequeued):
            self._ended(event.job_id, event.occurred_at)

    def _changed(self, event: ev.TrainingPlanChanged) -> None:
        name = event.spec.name
        if event.status == "DELETED":
            self.plans.pop(name, None)
            for job_id in [j for j, (plan, _, _) in self.running.items() if plan == name]:
                del self.running[job_id]
            return
        view = self.plans.get(name)
        if view is None:
            self.plans[name] = PlanView(event.spec)
        else:
            view.spec = event.spec

    def _dispatched(self, event: ev.JobDispatched) -> None:
        gpus: dict[str, int] = {}
        for placement in event.placements:
            plan = self.node_plan.get(placement.node_id)
            if plan is not None:
                per_slot = len(placement.gpus) or len(placement.slots)
                gpus[plan] = gpus.get(plan, 0) + per_slot
        for plan, count in gpus.items():  # an attempt is on one plan's nodes at most in practice
            self.running[event.job_id] = (plan, count, event.occurred_at)

    def _ended(self, job_id: str, at: int) -> None:
        found = self.running.pop(job_id, None)
        if found is None:
            return
        plan, gpus, since = found
        view = self.plans.get(plan)
        if view is not None and view.open is not None:
            view.used_ms += max(0, at - since) * gpus

    def _flush(self, plan: str, at: int) -> None:
        """Count the plan's running attempts up to ``at``; they count again from a next opening."""
        view = self.plans[plan]
        for job_id, (name, gpus, since) in list(self.running.items()):
            if name == plan:
                view.used_ms += max(0, at - since) * gpus
                self.running[job_id] = (name, gpus, at)

    def _restart(self, plan: str, at: int) -> None:
        for job_id, (name, gpus, _) in list(self.running.items()):
            if name == plan:
                self.running[job_id] = (name, gpus, at)

    def allocated(self, job_queue: str, share: str) -> dict[str, int]:
        """Per unit: what plans with an open window allocate to the share now (its limit's rise)."""
        out: dict[str, int] = {}
        for view in self.plans.values():
            if view.open is None:
                continue
            for a in view.spec.allocations:
                if (a.job_queue, a.quota_share) == (job_queue, share):
                    out[view.spec.unit] = out.get(view.spec.unit, 0) + a.count
        return out

    def windows_of(self, environment: str, unit: str, start: int, end: int) -> list[dict[str, Any]]:
        """The windows of the environment's plans for ``unit`` that overlap ``[start, end)``."""
        return [
            {"trainingPlanName": name, "start": w.start, "end": w.end, "count": view.spec.count}
            for name, view in sorted(self.plans.items())
            if view.spec.service_environment == environment and view.spec.unit == unit
            for w in view.spec.windows
            if w.start < end and w.end > start
        ]

    def instance_gpus(self, plan: str) -> int:
        """GPUs of one instance of the plan: its nodes' slots' (1 without a node)."""
        return max((g for node, g in self.node_gpus.items() if self.node_plan.get(node) == plan), default=1)

    def describe(self, now: int) -> list[dict[str, Any]]:
        return [self.row(name, now) for name in sorted(self.plans)]

    def row(self, name: str, now: int) -> dict[str, Any]:
        view = self.plans[name]
        spec = view.spec
        capacity, used = view.capacity_ms, view.used_ms
        if view.open is not None:
            capacity += max(0, now - view.opened_at) * self.instance_gpus(name) * spec.count
            used += sum(max(0, now - since) * g for plan, g, since in self.running.values() if plan == name)
        nodes = sorted(node for node, plan in self.node_plan.items() if plan == name)
        return {
            "trainingPlanName": name,
            "serviceEnvironment": spec.service_environment,
            "capacityUnit": spec.unit,
            "count": spec.count,
            "gracePeriodSeconds": spec.grace_seconds,
            "windows": [{"start": w.start, "end": w.end} for w in spec.windows],
            "allocations": [
                {"jobQueue": a.job_queue, "quotaShare": a.quota_share, "count": a.count}
                for a in spec.allocations
            ],
            "openWindow": None if view.open is None else {"start": view.open[0], "end": view.open[1]},
            "nodes": nodes,
            "usedGpuHours": round(used / HOUR_MS, 3),
            "idleGpuHours": round(max(0, capacity - used) / HOUR_MS, 3),
            "tags": dict(spec.tags),
        }
