"""The working context of one ``decide`` call: the state under trial, the clock, and emitted events.

The context also tracks which capacity units an input touched (``dirty``). Units are independent
(every quota figure is per unit), so the scheduling pass after an input only needs to revisit the
heads whose unit changed: a freed slot of ``ml.g5.xlarge`` cannot let an ``ml.p4d.24xlarge`` job run.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from gpuquota.core.evolve import evolve
from gpuquota.core.state import ClusterState, ShareKey
from gpuquota.wire import events as ev
from gpuquota.wire.base import Message
from gpuquota.wire.events import SchedulerEvent

E = TypeVar("E", bound=Message)

_RESOURCE_EVENTS = (
    ev.SchedulingPolicyChanged,
    ev.ServiceEnvironmentChanged,
    ev.JobQueueChanged,
    ev.QuotaShareChanged,
)


class Context:
    """Collects the events of one input, applying each as it is emitted so later choices see it."""

    __slots__ = ("dirty", "events", "input_id", "now", "state")

    def __init__(self, state: ClusterState, input_id: str, now: int) -> None:
        self.state = state
        self.input_id = input_id
        self.now = now
        self.events: list[SchedulerEvent] = []
        self.dirty: set[str] | None = set()
        """Units whose figures or heads changed; ``None`` means every unit."""

    def emit(self, event_type: type[E], **fields: Any) -> E:
        """Create the event (ids derive from the input's id: ``<input id>/<n>``), apply it, keep it."""
        # The core builds events from validated inputs and its own state, so they skip validation
        # (the tests round-trip every event type through JSON to keep this honest).
        event = cast(
            E,
            event_type.model_construct(
                event_id=f"{self.input_id}/{len(self.events)}", occurred_at=self.now, **fields
            ),
        )
        recorded = cast(SchedulerEvent, event)
        share = self._touch(recorded)
        evolve(self.state, recorded)
        if share is not None:
            self._touch_head(share)
        self.events.append(recorded)
        return event

    def touch_all(self) -> None:
        self.dirty = None

    def _touch(self, event: SchedulerEvent) -> ShareKey | None:
        """Mark the units ``event`` changes; return the share whose head it may change."""
        state, dirty = self.state, self.dirty
        if isinstance(event, _RESOURCE_EVENTS):
            self.dirty = None
        elif dirty is None:
            pass
        elif isinstance(event, ev.NodeRegistered):
            dirty.update(slot.unit for slot in event.slots)
        elif isinstance(event, ev.NodeDraining | ev.NodeLost):
            dirty.update(slot.unit for slot in state.nodes[event.node_id].slots)
        elif isinstance(event, ev.PreemptionHoldReleased):
            dirty.add(state.holds[event.job_id].unit)
        elif isinstance(event, ev.JobAccepted):
            dirty.add(event.job.unit)
            return (event.job.job_queue, event.job.quota_share)
        else:
            job_id = getattr(event, "job_id", None)
            job = state.jobs.get(job_id) if job_id is not None else None
            if job is not None:
                dirty.add(job.unit)
                return job.share
        return None

    def _touch_head(self, key: ShareKey) -> None:
        """A job event may have given its share a new head, whose unit then needs a look."""
        share = self.state.shares.get(key)
        head = None if share is None else self.state.head(share)
        if head is not None and self.dirty is not None:
            self.dirty.add(head.unit)
