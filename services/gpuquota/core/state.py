"""The scheduler's state, and the journal that lets ``decide`` stay pure.

Theory of operation
-------------------
The state is one aggregate for everything the scheduler owns: resources, nodes, jobs and the indexes
the scheduling pass needs (per-share queues in scheduling order, usage counters, free slots). It is
built only by ``evolve``, one event at a time, so folding the log rebuilds it exactly.

For speed the state is mutable: copying an aggregate that holds a million queued jobs for every input
would cost far more than deciding. Purity is kept at the boundary instead. Every mutation goes
through the few ``Journal`` helpers below; ``decide`` opens a journal, applies the events it decides
(so that later decisions of the same input see earlier ones), and rolls the journal back before it
returns. ``decide(state, input)`` therefore leaves ``state`` exactly as it found it, which the
property tests check with ``fingerprint``.

Invariant: nothing outside ``gpuquota.core.evolve`` mutates a ``ClusterState``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from gpuquota.core.sortedkeys import SortedKeys
from gpuquota.wire.base import (
    JobQueueSpec,
    JobSpec,
    JobStatus,
    Placement,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    State,
    Strategy,
)

_UNPICKLING_SHARE = QuotaShareSpec.model_construct(
    name="", job_queue="", capacity_limits=(), strategy=Strategy.RESERVE
)
"""A placeholder for constructors called without arguments. Every record's constructor can be: the
compiled core (``gpuquota._native``) runs ``__init__`` when pickle rebuilds an object (snapshots),
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

VictimKey = tuple[int, int, str]
"""A dispatched job's place as a preemption victim: (priority, -dispatch sequence, job id) (S4.1)."""

Blocked = tuple[str, str, str, int]
"""(job id, code, status reason, since when) of a share's blocked head job (S9.1, S9.2)."""

ShareKey = tuple[str, str]
"""(job queue name, quota share name): share names are unique within their queue."""


class Journal:
    """Records how to undo each mutation while a ``decide`` is in progress."""

    __slots__ = ("undo",)

    def __init__(self) -> None:
        self.undo: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def rollback(self) -> None:
        for fn, args in reversed(self.undo):
            fn(*args)
        self.undo.clear()


class Mutable:
    """Base of state records: attribute writes are journalled when a journal is open."""

    __slots__ = ("_journal",)

    def __init__(self, journal: list[Journal | None] | None = None) -> None:
        self._journal: list[Journal | None] = [None] if journal is None else journal

    def put(self, name: str, value: Any) -> None:
        journal = self._journal[0]
        if journal is not None:
            journal.undo.append((setattr, (self, name, getattr(self, name))))
        setattr(self, name, value)


class JobRecord(Mutable):
    """The scheduler's view of one non-terminal job.

    It copies what it needs out of the submitted ``JobSpec`` instead of keeping the pydantic model:
    a million queued jobs must fit in about 2 KB each.
    """

    __slots__ = (
        "attempt_duration_seconds",
        "attempt_id",
        "attempt_number",
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
        self.dispatch_seq = 0
        self.runnable_since = at

    def __getstate__(self) -> tuple[Any, ...]:
        """Snapshots hold a million of these: a plain tuple pickles and loads faster than attribute
        dictionaries, and the compiled core (``gpuquota._native``) restores it with direct stores."""
        return (
            self._journal,
            self.attempt_duration_seconds,
            self.attempt_id,
            self.attempt_number,
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
        return (-self.priority, self.created_at, self.job_id)

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
        "deleting",
        "dispatched",
        "head_since",
        "key",
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
        self.backoff: tuple[int, int, int] | None = None
        """S10.2 reborrow backoff: (may borrow again at, current length, last reclaim) in ms."""
        self._limits: tuple[QuotaShareSpec, dict[str, int]] | None = None

    @property
    def limits(self) -> dict[str, int]:
        """Per unit, the share's own limit; derived from ``spec`` (a cache, not state)."""
        cached = self._limits
        if cached is None or cached[0] is not self.spec:
            cached = (self.spec, {cap.unit: cap.max_capacity for cap in self.spec.capacity_limits})
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
    __slots__ = ("address", "draining", "free", "last_heartbeat", "node_id", "online", "pool", "slots")

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
        self.last_heartbeat = at
        self.free: dict[str, list[int]] = {}
        """Per unit: indexes of the free slots, ascending (a plain list: a node has a handful)."""
        for index, slot in enumerate(slots):
            self.free.setdefault(slot.unit, []).append(index)

    @property
    def usable(self) -> bool:
        return self.online and not self.draining


class ClusterState:
    """Everything the scheduler knows. Build it with ``ClusterState()`` and ``evolve``, nothing else."""

    def __init__(self, heartbeat_timeout_ms: int = 30_000) -> None:
        self._journal: list[Journal | None] = [None]
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.policies: dict[str, SchedulingPolicySpec] = {}
        self.environments: dict[str, ServiceEnvironmentSpec] = {}
        self.queues: dict[str, JobQueueSpec] = {}
        self.shares: dict[ShareKey, ShareRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.holds: dict[str, Hold] = {}
        self.queues_deleting: set[str] = set()
        """Job queues deleted while they had quota shares: DELETED once those are gone."""
        self.deadlines = SortedKeys()
        """(deadline ms, job id, attempt id) of attempts with a ``attemptDurationSeconds`` timeout."""
        self.pool_slots: dict[str, dict[str, int]] = {}
        """Per pool and unit: slots on online, non-draining nodes."""
        self.pool_free: dict[str, dict[str, int]] = {}
        """Per pool and unit: free slots on online, non-draining nodes."""
        self.queue_usage: dict[tuple[str, str], int] = {}
        """Per (job queue, unit): instances held by the queue's dispatched jobs (its shares' usage)."""
        self.free_index: dict[tuple[str, str], list[tuple[int, str]]] = {}
        """Per (pool, unit): (free slots, node id) of usable nodes with a free slot, for placement (S6);
        sorted plain lists (``list_insort``), like ``ShareRecord.victims``: short enough that C-level
        inserts beat ``SortedKeys``' bookkeeping."""
        self.dispatch_counter = 0
        self.applied = 0
        """How many events have been applied: the log position this state corresponds to."""
        self.config_version = 0
        """Bumped by every resource change; keys caches of values derived from the configuration."""
        self._derived: dict[tuple[str, str], tuple[int, Any]] = {}

    def cached(self, key: tuple[str, str]) -> Any:
        """A value derived from the configuration by ``cache(key, value)``, or ``None`` once the
        configuration has changed since (a cache, not state: never journalled; values are never None)."""
        hit = self._derived.get(key)
        return hit[1] if hit is not None and hit[0] == self.config_version else None

    def cache(self, key: tuple[str, str], value: Any) -> Any:
        self._derived[key] = (self.config_version, value)
        return value

    # ----- the journal -------------------------------------------------------------------------

    @contextmanager
    def trial(self) -> Iterator[None]:
        """Within the block, mutations are recorded and undone on exit (used by ``decide``)."""
        if self._journal[0] is not None:
            raise RuntimeError("nested trial")
        journal = Journal()
        self._journal[0] = journal
        try:
            yield
        finally:
            self._journal[0] = None
            journal.rollback()
            self._derived.clear()  # values derived inside the trial may name objects it created

    @property
    def journal_cell(self) -> list[Journal | None]:
        return self._journal

    def _record(self, fn: Callable[..., Any], *args: Any) -> None:
        journal = self._journal[0]
        if journal is not None:
            journal.undo.append((fn, args))

    def put(self, name: str, value: Any) -> None:
        self._record(setattr, self, name, getattr(self, name))
        setattr(self, name, value)

    def dict_set(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        if key in mapping:
            self._record(mapping.__setitem__, key, mapping[key])
        else:
            self._record(mapping.pop, key)
        mapping[key] = value

    def child(self, mapping: dict[Any, Any], key: Any, factory: Callable[[], Any]) -> Any:
        """``mapping[key]``, created with ``factory()`` (journalled) when missing."""
        if key not in mapping:
            self.dict_set(mapping, key, factory())
        return mapping[key]

    def dict_pop(self, mapping: dict[Any, Any], key: Any) -> None:
        if key in mapping:
            self._record(mapping.__setitem__, key, mapping.pop(key))

    def dict_add(self, mapping: dict[Any, int], key: Any, delta: int) -> None:
        self.dict_set(mapping, key, mapping.get(key, 0) + delta)

    def set_add(self, items: set[Any], item: Any) -> None:
        if item not in items:
            self._record(items.discard, item)
            items.add(item)

    def set_discard(self, items: set[Any], item: Any) -> None:
        if item in items:
            self._record(items.add, item)
            items.discard(item)

    def sorted_add(self, items: SortedKeys, item: Any) -> None:
        self._record(items.discard, item)
        items.add(item)

    def sorted_discard(self, items: SortedKeys, item: Any) -> None:
        if items.discard(item):
            self._record(items.add, item)

    def list_insort(self, items: list[Any], item: Any) -> None:
        """Insert into a plain sorted list (small ones, where ``SortedKeys`` costs more than it saves)."""
        self._record(items.remove, item)
        insort(items, item)

    def list_discard(self, items: list[Any], item: Any) -> None:
        index = bisect_left(items, item)
        if index < len(items) and items[index] == item:
            del items[index]
            self._record(insort, items, item)

    # ----- read helpers ------------------------------------------------------------------------

    def environment_of_queue(self, queue_name: str) -> ServiceEnvironmentSpec | None:
        queue = self.queues.get(queue_name)
        return None if queue is None else self.environments.get(queue.service_environment)

    def shares_of_queue(self, queue_name: str) -> list[ShareRecord]:
        return [share for key, share in self.shares.items() if key[0] == queue_name]

    def head(self, share: ShareRecord) -> JobRecord | None:
        """The share's first RUNNABLE job (S3.1); ``evolve`` keeps ``head_since`` naming it."""
        since = share.head_since
        return None if since is None else self.jobs[since[0]]


def fingerprint(state: ClusterState) -> tuple[Any, ...]:
    """A comparable summary of every piece of state; equal fingerprints mean equal states."""
    jobs = tuple(
        (
            j.job_id,
            j.priority,
            j.status,
            j.status_reason,
            j.attempt_id,
            j.attempt_number,
            j.placements,
            j.parts_over,
            j.failures,
            j.preempted_count,
            None if j.stop is None else (j.stop.cause, j.stop.reason, j.stop.preemptor),
            j.scheduled_at,
            j.started_at,
            j.dispatch_seq,
            j.runnable_since,
        )
        for j in sorted(state.jobs.values(), key=lambda j: j.job_id)
    )
    shares = tuple(
        (
            key,
            s.spec,
            s.deleting,
            tuple(s.queue),
            sorted(s.usage.items()),
            sorted((u, sorted(ids)) for u, ids in s.dispatched.items()),
            sorted((u, tuple(keys)) for u, keys in s.victims.items()),
            s.head_since,
            s.blocked,
            s.backoff,
        )
        for key, s in sorted(state.shares.items())
    )
    nodes = tuple(
        (
            n.node_id,
            n.pool,
            n.slots,
            n.online,
            n.draining,
            n.address,
            n.last_heartbeat,
            sorted((u, tuple(free)) for u, free in n.free.items()),
        )
        for n in sorted(state.nodes.values(), key=lambda n: n.node_id)
    )
    holds = tuple(
        (h.job_id, h.se, h.share, h.unit, h.count, sorted(h.victims))
        for h in sorted(state.holds.values(), key=lambda h: h.job_id)
    )
    return (
        sorted(state.policies.items()),
        sorted(state.environments.items()),
        sorted(state.queues.items()),
        shares,
        jobs,
        nodes,
        holds,
        sorted(state.queues_deleting),
        tuple(state.deadlines),
        sorted((p, sorted(c.items())) for p, c in state.pool_slots.items()),
        sorted((p, sorted(c.items())) for p, c in state.pool_free.items()),
        sorted((k, v) for k, v in state.queue_usage.items() if v),
        sorted((k, tuple(v)) for k, v in state.free_index.items()),
        state.dispatch_counter,
        state.applied,
    )
