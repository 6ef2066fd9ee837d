"""The records a ``ClusterState`` holds: jobs, quota shares, holds and nodes, and the keys that order them.

Every record is ``Mutable``: its attribute writes are journalled while a ``decide`` trial is open
(``gpuquota.core.journal``). Only ``gpuquota.core.evolve`` changes them.
"""

from __future__ import annotations

from typing import Any, Final

from gpuquota.core.journal import Journal, Mutable
from gpuquota.core.sortedkeys import SortedKeys
from gpuquota.wire.base import (
    JobSpec,
    JobStatus,
    Placement,
    QuotaShareSpec,
    SlotOffer,
    State,
    Strategy,
)

_UNPICKLING_SHARE = QuotaShareSpec.model_construct(
    name="", job_queue="", capacity_limits=(), strategy=Strategy.RESERVE
)
"""A placeholder for constructors called without arguments. Every record's constructor can be: the
compiled core (``gpuquota.native.loader``) runs ``__init__`` when pickle rebuilds an object (snapshots),
and the pickled attributes then replace what it set."""

# Enum members as plain module constants: reading ``JobStatus.RUNNABLE`` goes through the enum class
# (about 150 ns), and the scheduling pass and ``evolve`` compare statuses and strategies constantly.
RUNNABLE: Final = JobStatus.RUNNABLE
SCHEDULED: Final = JobStatus.SCHEDULED
STARTING: Final = JobStatus.STARTING
RUNNING: Final = JobStatus.RUNNING
RESERVE: Final = Strategy.RESERVE
LEND_AND_BORROW: Final = Strategy.LEND_AND_BORROW
ENABLED: Final = State.ENABLED

QueueKey = tuple[int, int, str]
"""A RUNNABLE job's place in its share: (-priority, created_at, job_id); smallest runs first (S3.1)."""


def queue_order(priority: int, created_at: int, job_id: str) -> QueueKey:
    """S3.1: higher ``schedulingPriority`` first, then the older job, then the smaller job id (the
    read model orders its RUNNABLE jobs by the same key)."""
    return (-priority, created_at, job_id)


VictimKey = tuple[int, int, str]
"""A dispatched job's place as a preemption victim: (priority, -dispatch sequence, job id) (S4.1)."""

Blocked = tuple[str, str, str, int]
"""(job id, code, status reason, since when) of a share's blocked head job (S9.1, S9.2)."""

ShareKey = tuple[str, str]
"""(job queue name, quota share name): share names are unique within their queue."""


class JobRecord(Mutable):
    """The scheduler's view of one non-terminal job.

    It copies what it needs out of the submitted ``JobSpec`` instead of keeping the pydantic model:
    a million queued jobs must fit in about 2 KB each.
    """

    __slots__ = (
        "attempt_duration_seconds",
        "attempt_id",
        "attempt_number",
        "checkpoint_at",
        "count",
        "created_at",
        "dispatch_seq",
        "evaluate_on_exit",
        "failures",
        "job_id",
        "job_name",
        "parts_over",
        "payload",
        "placements",
        "preempted_count",
        "preemption_retries",
        "priority",
        "retry_attempts",
        "runnable_since",
        "scheduled_at",
        "share",
        "started_at",
        "status",
        "status_reason",
        "stop",
        "unit",
    )

    def __init__(
        self, journal: list[Journal | None] | None = None, spec: JobSpec | None = None, at: int = 0
    ) -> None:
        super().__init__(journal)
        if spec is not None:
            self.job_id = spec.job_id
            self.job_name = spec.job_name
            self.share: ShareKey = (spec.job_queue, spec.quota_share)
            self.unit = spec.unit
            self.count = spec.count
            self.created_at = spec.created_at
            self.priority = spec.priority
            self.retry_attempts = spec.retry_attempts
            self.evaluate_on_exit = spec.evaluate_on_exit
            self.preemption_retries = spec.preemption_retries
            self.attempt_duration_seconds = spec.attempt_duration_seconds
            self.payload = spec.payload
        else:  # unpickling a snapshot: ``__setstate__`` sets everything next, so only placeholders
            self.job_id = self.job_name = self.unit = self.payload = ""
            self.share = ("", "")
            self.count = self.created_at = self.priority = 0
            self.retry_attempts = 1
            self.evaluate_on_exit = ()
            self.preemption_retries = self.attempt_duration_seconds = None
        self.status = JobStatus.RUNNABLE
        self.status_reason = ""
        self.attempt_number = 0
        self.attempt_id: str | None = None
        self.placements: tuple[Placement, ...] = ()
        self.parts_over: tuple[tuple[str, str], ...] = ()
        """(node id, final status) of the parts of a multi-node attempt that have ended (I6)."""
        self.failures = 0
        self.preempted_count = 0
        self.stop: StopInfo | None = None
        self.scheduled_at: int | None = None
        self.started_at: int | None = None
        self.checkpoint_at: int | None = None
        """S12: when the job last checkpointed, as its node reported (``AttemptCheckpointed``)."""
        self.dispatch_seq = 0
        self.runnable_since = at

    def __getstate__(self) -> tuple[Any, ...]:
        """Snapshots hold a million of these: a plain tuple pickles and loads faster than attribute
        dictionaries, and the compiled core (``gpuquota.native.loader``) restores it with direct stores."""
        return (
            self._journal,
            self.attempt_duration_seconds,
            self.attempt_id,
            self.attempt_number,
            self.checkpoint_at,
            self.count,
            self.created_at,
            self.dispatch_seq,
            self.evaluate_on_exit,
            self.failures,
            self.job_id,
            self.job_name,
            self.parts_over,
            self.payload,
            self.placements,
            self.preempted_count,
            self.preemption_retries,
            self.priority,
            self.retry_attempts,
            self.runnable_since,
            self.scheduled_at,
            self.share,
            self.started_at,
            self.status,
            self.status_reason,
            self.stop,
            self.unit,
        )

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        (
            self._journal,
            self.attempt_duration_seconds,
            self.attempt_id,
            self.attempt_number,
            self.checkpoint_at,
            self.count,
            self.created_at,
            self.dispatch_seq,
            self.evaluate_on_exit,
            self.failures,
            self.job_id,
            self.job_name,
            self.parts_over,
            self.payload,
            self.placements,
            self.preempted_count,
            self.preemption_retries,
            self.priority,
            self.retry_attempts,
            self.runnable_since,
            self.scheduled_at,
            self.share,
            self.started_at,
            self.status,
            self.status_reason,
            self.stop,
            self.unit,
        ) = state

    @property
    def queue_key(self) -> QueueKey:
        return queue_order(self.priority, self.created_at, self.job_id)

    @property
    def victim_key(self) -> VictimKey:
        """S4.1 victim order: lower priority, then most recently dispatched, then job id."""
        return (self.priority, -self.dispatch_seq, self.job_id)

    @property
    def dispatched(self) -> bool:
        return self.attempt_id is not None


class StopInfo:
    """Why a dispatched job is being stopped; decides its outcome when its node reports it stopped."""

    __slots__ = ("cause", "preemptor", "reason")

    def __init__(self, cause: str = "", reason: str = "", preemptor: str | None = None) -> None:
        self.cause = cause  # PREEMPTED | TERMINATED | TIMEOUT | SHARE_DELETED
        self.reason = reason
        self.preemptor = preemptor


class ShareRecord(Mutable):
    __slots__ = (
        "_limits",
        "backoff",
        "blocked",
        "blocked_behind",
        "deleting",
        "dispatched",
        "head_since",
        "key",
        "plan_extra",
        "queue",
        "spec",
        "usage",
        "victims",
    )

    def __init__(
        self, journal: list[Journal | None] | None = None, spec: QuotaShareSpec = _UNPICKLING_SHARE
    ) -> None:
        super().__init__(journal)
        self.spec = spec
        self.key: ShareKey = (spec.job_queue, spec.name)
        self.deleting = False
        self.queue = SortedKeys()
        """``QueueKey``s of the share's RUNNABLE jobs, in scheduling order."""
        self.usage: dict[str, int] = {}
        self.dispatched: dict[str, set[str]] = {}
        self.victims: dict[str, list[VictimKey]] = {}
        """Per unit: dispatched jobs that are not stopping, in S4.1 victim order (``victim_key``)."""
        self.head_since: tuple[str, int] | None = None
        """(job id, since when) of the job at the head of this share."""
        self.blocked: Blocked | None = None
        """The head job recorded as blocked (S9.1), its code, status reason and since when (S9.2)."""
        self.blocked_behind: dict[str, tuple[str, str]] = {}
        """Queued jobs other than the head recorded as blocked (S9.1): job id -> (code, status reason)."""
        self.backoff: tuple[int, int, int] | None = None
        """S10.2 reborrow backoff: (may borrow again at, current length, last reclaim) in ms."""
        self.plan_extra: dict[str, int] = {}
        """Per unit: instances that training plans with an open window allocate to the share (S11);
        replaced whole (never mutated) when a window opens or closes."""
        self._limits: tuple[QuotaShareSpec, dict[str, int], dict[str, int]] | None = None

    @property
    def limits(self) -> dict[str, int]:
        """Per unit, the share's own limit: its spec's, raised by open plans' allocations (a cache)."""
        cached = self._limits
        if cached is None or cached[0] is not self.spec or cached[2] is not self.plan_extra:
            limits = {cap.unit: cap.max_capacity for cap in self.spec.capacity_limits}
            for unit, extra in self.plan_extra.items():
                if unit in limits:  # an allocation raises a limit the share has; it adds no unit
                    limits[unit] += extra
            cached = (self.spec, limits, self.plan_extra)
            self._limits = cached
        return cached[1]


class Hold:
    """Capacity held for a preemptor while its victims stop (S4.3)."""

    __slots__ = ("count", "job_id", "se", "share", "unit", "victims")

    def __init__(
        self, job_id: str = "", se: str = "", share: ShareKey = ("", ""), unit: str = "", count: int = 0
    ) -> None:
        self.job_id = job_id
        self.se = se
        self.share = share
        self.unit = unit
        self.count = count
        self.victims: set[str] = set()


class NodeRecord(Mutable):
    __slots__ = (
        "address",
        "draining",
        "free",
        "incarnation",
        "last_heartbeat",
        "node_id",
        "online",
        "plan_closed",
        "pool",
        "slots",
        "training_plan",
    )

    def __init__(
        self,
        journal: list[Journal | None] | None = None,
        node_id: str = "",
        pool: str = "",
        slots: tuple[SlotOffer, ...] = (),
        at: int = 0,
    ):
        super().__init__(journal)
        self.node_id = node_id
        self.pool = pool
        self.slots = slots
        self.online = True
        self.draining = False
        self.address = ""
        self.incarnation = ""
        """``RegisterNode.incarnation`` of the node's last registration (``RunAttempt`` carries it)."""
        self.last_heartbeat = at
        self.training_plan: str | None = None
        """The training plan the node belongs to (S11), if any."""
        self.plan_closed = False
        """A plan's node while no window of its plan is open: it offers no slots (S11)."""
        self.free: dict[str, list[int]] = {}
        """Per unit: indexes of the free slots, ascending (a plain list: a node has a handful)."""
        for index, slot in enumerate(slots):
            self.free.setdefault(slot.unit, []).append(index)

    @property
    def usable(self) -> bool:
        return self.online and not self.draining and not self.plan_closed
