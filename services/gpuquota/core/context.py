"""The working context of one ``decide`` call: the state under trial, the clock, and emitted events."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from gpuquota.core.evolve import evolve
from gpuquota.core.state import ClusterState
from gpuquota.wire.base import Message
from gpuquota.wire.events import SchedulerEvent

E = TypeVar("E", bound=Message)


class Context:
    """Collects the events of one input, applying each as it is emitted so later choices see it."""

    __slots__ = ("events", "input_id", "now", "state")

    def __init__(self, state: ClusterState, input_id: str, now: int) -> None:
        self.state = state
        self.input_id = input_id
        self.now = now
        self.events: list[SchedulerEvent] = []

    def emit(self, event_type: type[E], **fields: Any) -> E:
        """Create the event (ids derive from the input's id: ``<input id>/<n>``), apply it, keep it."""
        event = event_type(event_id=f"{self.input_id}/{len(self.events)}", occurred_at=self.now, **fields)
        recorded = cast(SchedulerEvent, event)
        evolve(self.state, recorded)
        self.events.append(recorded)
        return event
