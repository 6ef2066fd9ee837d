"""The read side's one projector: the decided events, in log order, into the gateway's ``ReadModel``.

Theory of operation
-------------------
Both modes project the same way: every decided record's events, in log order, through
:meth:`Projector.project`. Only the feed differs. The embedded shell hands each batch's events over
in-process once their append committed (``SchedulerShell``), and feeds the whole log through it when it
recovers; the distributed gateway tails the pool's log in the event store
(``gateway.log_tail.LogProjector``), and rebuilds a fresh projector from the log when the log does not
continue what it folded.

An event the read model cannot apply (a projection bug, a log that lost its end) leaves its views wrong
from there on, so it is never hidden: :meth:`Projector.project` raises ``ProjectionFailed`` and
:attr:`Projector.failure` keeps the first such error (logged). The embedded shell decides on (the
scheduler's state is not the read model's) and its ``/health/live`` answers 503 with the reason until
a restart folds the log again; the distributed gateway's log tail rebuilds a fresh projector from the
log at once and fails its ``/health/live`` only when the rebuild meets an error too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpuquota.read.model import ReadModel
from gpuquota.wire.events import SchedulerEvent

log = logging.getLogger(__name__)


class ProjectionFailed(Exception):
    """The read model could not apply an event (``Projector.failure`` says which, and why)."""


class Projector:
    """Feeds decided events into one ``ReadModel`` and keeps the first error (see the module docstring)."""

    def __init__(self, read_model: ReadModel | None = None) -> None:
        self.read_model = read_model or ReadModel()
        self.failure: str | None = None
        """The first event this projection could not apply (None: its views are right)."""

    def project(self, events: Iterable[SchedulerEvent]) -> None:
        """Apply ``events`` in order; an error is kept in ``failure`` and raised as ``ProjectionFailed``
        (the events after it are not applied)."""
        apply = self.read_model.apply
        for event in events:
            try:
                apply(event)
            except Exception as exc:
                reason = f"the read model could not apply {event.type} {event.event_id}: {exc!r}"
                if self.failure is None:
                    self.failure = reason
                    log.error("%s", reason, exc_info=exc)
                raise ProjectionFailed(reason) from exc

    def reset(self) -> None:
        """Start again from nothing (before the whole log is fed again)."""
        self.read_model.reset()
        self.failure = None

    def adopt(self, other: Projector) -> None:
        """Take over ``other``'s projection (one rebuilt from the log), in place: every holder of this
        projector's read model sees the new views."""
        self.read_model.adopt(other.read_model)
        self.failure = other.failure
