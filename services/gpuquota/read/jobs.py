"""A job as the read model keeps it: every job ever seen, so each is kept compact.

Theory of operation
-------------------
The read model keeps every job it ever saw for Describe and List, finished ones too (gpuquota has no
retention window: Describe of a finished job and ListServiceJobs with a terminal ``jobStatus`` answer
from the whole log), so a long log's recovery costs a job's record times the jobs it ever saw. A
finished job cost 2.2 KB kept as the event's pydantic ``JobSpec`` (its field dictionary alone 464
bytes), lists per view, ``(ms, status)`` tuples and the attempt's ARN string; 1,000,000 log events
(333,400 finished jobs) took 806 MB of RSS to recover. Kept as below a job costs about 1.1 KB, and that
recovery 446 MB (``benchmarks.recovery``, docs/benchmarks.md):

* the spec's fields in slots: those List and Describe read by name (``_NAMED``), the others as one
  tuple, and :attr:`JobView.spec` renders the whole ``JobSpec`` on demand (``model_construct``: the
  values were validated when the event was decoded; 15-40 µs, so no request path needs it); the
  names every job repeats (queue, share, unit) are interned, so they cost nothing per job;
* the status history as one ``array`` of (epoch ms, status index) pairs;
* attempts, preemptions and outputs as tuples (the empty one is shared), no tags dictionary when
  the job has none, and no ARN kept per attempt (``ArnFactory.training_job`` renders it).
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass
from typing import Any

from gpuquota.core.records import QueueKey, queue_order
from gpuquota.wire.base import ExitRule, JobSpec, JobStatus

HISTORY = 64
"""How many status changes ``JobView.history`` keeps (the oldest are dropped)."""

ShareKey = tuple[str, str]

_NAMED = (
    *("job_id", "job_name", "job_queue", "quota_share", "unit", "count", "created_at"),
    *("payload", "retry_attempts", "evaluate_on_exit", "preemption_retries", "attempt_duration_seconds"),
)
"""The spec's fields that List and Describe read, kept by name (the others are rendered with ``spec``)."""
_INTERNED = frozenset({"job_queue", "quota_share", "unit"})
"""Names every job of a share repeats: one string each, not one per job."""
_OTHERS = tuple(name for name in JobSpec.model_fields if name not in _NAMED)
_STATUSES: tuple[JobStatus, ...] = tuple(JobStatus)
_STATUS_INDEX = {status: index for index, status in enumerate(_STATUSES)}
_FIELDS_SETS: dict[frozenset[str], frozenset[str]] = {}
"""One frozen ``model_fields_set`` per distinct set (pydantic gives each decoded spec its own)."""


@dataclass(slots=True)
class AttemptView:
    attempt_id: str
    scheduled_at: int
    started_at: int | None = None
    stopped_at: int | None = None
    status_reason: str | None = None
    outputs: tuple[dict[str, str], ...] = ()
    """gpuquota's ``gpuquotaOutputs``: where each instance kept /opt/ml/model and /opt/ml/output (I6)."""
    checkpoint_at: int | None = None
    """gpuquota's ``gpuquotaCheckpointAt``: the attempt's last checkpoint as its node reported it (S12)."""
    lost_work: dict[str, Any] | None = None
    """gpuquota's ``gpuquotaLostWork`` of a preempted attempt (S12): ``lost_work``."""


class JobView:
    """One service job as Describe and List show it (see the module docstring for its layout)."""

    __slots__ = (
        *_NAMED,
        "_others",
        "status",
        "status_reason",
        "blocked_reason",
        "priority",
        "scheduled_at",
        "started_at",
        "stopped_at",
        "is_terminated",
        "runnable_since",
        "attempts",
        "current",
        "held",
        "preempted_count",
        "recent_preempted",
        "preemptions",
        "_history",
        "_tags",
        "pending_input",
    )

    job_id: str
    job_name: str
    job_queue: str
    quota_share: str
    unit: str
    count: int
    created_at: int
    payload: str
    retry_attempts: int
    evaluate_on_exit: tuple[ExitRule, ...]
    preemption_retries: int | None
    attempt_duration_seconds: int | None

    def __init__(
        self,
        spec: JobSpec,
        priority: int = 0,
        tags: dict[str, str] | None = None,
        pending_input: str | None = None,
    ) -> None:
        self.spec = spec
        self.status = JobStatus.SUBMITTED
        self.status_reason: str | None = None
        self.blocked_reason: str | None = None
        """S9.1: while the job is a blocked head, its ``statusReason`` (``JobBlocked``)."""
        self.priority = priority
        self.scheduled_at: int | None = None
        self.started_at: int | None = None
        self.stopped_at: int | None = None
        self.is_terminated = False
        self.runnable_since = 0
        self.attempts: tuple[AttemptView, ...] = ()
        self.current: AttemptView | None = None
        self.held: tuple[str, int] | None = None
        self.preempted_count = 0
        self.recent_preempted: tuple[AttemptView, ...] = ()
        self.preemptions: tuple[dict[str, Any], ...] = ()
        """The preemption decisions against this job (``JobPreempted``), newest first, at most 10."""
        self._history: array[int] | None = None
        self.tags = tags or {}
        self.pending_input = pending_input

    # ----- the spec ----------------------------------------------------------------------------

    @property
    def spec(self) -> JobSpec:
        """The job's ``JobSpec``, rendered from what is kept (a new object each time)."""
        others = self._others
        fields = dict(zip(_OTHERS, others, strict=False))
        fields["tags"] = dict(fields["tags"] or {})
        return JobSpec.model_construct(
            set(others[-1]),
            **{name: getattr(self, name) for name in _NAMED},
            **fields,
        )

    @spec.setter
    def spec(self, spec: JobSpec) -> None:
        for name in _NAMED:
            value = getattr(spec, name)
            setattr(self, name, sys.intern(value) if name in _INTERNED else value)
        given = frozenset(spec.model_fields_set)
        values = [getattr(spec, name) for name in _OTHERS]
        values[_OTHERS.index("tags")] = spec.tags or None
        self._others = (*values, _FIELDS_SETS.setdefault(given, given))

    @property
    def tags(self) -> dict[str, str]:
        """The job's tags now (TagResource changes them; the spec keeps those it was submitted with)."""
        return self._tags or {}

    @tags.setter
    def tags(self, tags: dict[str, str]) -> None:
        self._tags = tags or None

    # ----- derived -----------------------------------------------------------------------------

    @property
    def share(self) -> ShareKey:
        return (self.job_queue, self.quota_share)

    @property
    def runnable_key(self) -> QueueKey:
        return queue_order(self.priority, self.created_at, self.job_id)

    @property
    def terminal(self) -> bool:
        return self.status in (JobStatus.SUCCEEDED, JobStatus.FAILED)

    # ----- history -----------------------------------------------------------------------------

    @property
    def history(self) -> list[tuple[int, str]]:
        """(epoch ms, status) of the job's status changes, oldest first (timelines, ``explain``)."""
        kept = self._history
        if kept is None:
            return []
        return [(kept[i], _STATUSES[kept[i + 1]].value) for i in range(0, len(kept), 2)]

    def note_status(self, at: int) -> None:
        """Record that the job reached its current status at ``at`` (after SUBMITTED at creation)."""
        kept = self._history
        if kept is None:
            kept = array("q", (self.created_at, _STATUS_INDEX[JobStatus.SUBMITTED]))
        # a new array, not ``extend``: one of the exact size (``extend`` leaves room to grow)
        self._history = (kept + array("q", (at, _STATUS_INDEX[self.status])))[-2 * HISTORY :]

    # ----- attempts ----------------------------------------------------------------------------

    def start_attempt(self, attempt: AttemptView) -> None:
        self.attempts = (*self.attempts, attempt)
        self.current = attempt
