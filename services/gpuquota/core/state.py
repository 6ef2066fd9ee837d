"""The scheduler's state: one aggregate, its caches and its fingerprint.

Theory of operation
-------------------
The state is one aggregate for everything the scheduler owns: resources, nodes, jobs and the indexes
the scheduling pass needs (per-share queues in scheduling order, usage counters, free slots). It is
built only by ``evolve``, one event at a time, so folding the log rebuilds it exactly.

The state is mutable for speed; every mutation is journalled so that ``decide`` stays pure
(``gpuquota.core.journal``). Its records (jobs, shares, holds, nodes) are in ``gpuquota.core.records``
and are re-exported here.

Invariant: nothing outside ``gpuquota.core.evolve`` mutates a ``ClusterState``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpuquota.core.journal import Journal, Journalled, Mutable
from gpuquota.core.policy import DEFAULT_POLICY
from gpuquota.core.records import (
    ENABLED,
    LEND_AND_BORROW,
    RESERVE,
    RUNNABLE,
    RUNNING,
    SCHEDULED,
    STARTING,
    Blocked,
    Hold,
    JobRecord,
    NodeRecord,
    QueueKey,
    ShareKey,
    ShareRecord,
    StopInfo,
    VictimKey,
)
from gpuquota.core.sortedkeys import SortedKeys
from gpuquota.wire.base import JobQueueSpec, SchedulingPolicySpec, ServiceEnvironmentSpec, TrainingPlanSpec

__all__ = [
    "ENABLED",
    "LEND_AND_BORROW",
    "RESERVE",
    "RUNNABLE",
    "RUNNING",
    "SCHEDULED",
    "STARTING",
    "Blocked",
    "ClusterState",
    "Hold",
    "JobRecord",
    "Journal",
    "Mutable",
    "NodeRecord",
    "QueueKey",
    "ShareKey",
    "ShareRecord",
    "StopInfo",
    "VictimKey",
    "fingerprint",
]


class ClusterState(Journalled):
    """Everything the scheduler knows. Build it with ``ClusterState()`` and ``evolve``, nothing else."""

    def __init__(self, heartbeat_timeout_ms: int = DEFAULT_POLICY.heartbeat_timeout_ms) -> None:
        super().__init__()
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.policies: dict[str, SchedulingPolicySpec] = {}
        self.environments: dict[str, ServiceEnvironmentSpec] = {}
        self.queues: dict[str, JobQueueSpec] = {}
        self.shares: dict[ShareKey, ShareRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.holds: dict[str, Hold] = {}
        self.plans: dict[str, TrainingPlanSpec] = {}
        """Training plans (S11), by name."""
        self.plan_windows: dict[str, tuple[int, int]] = {}
        """Plan -> (start, end) ms of its window that is open now (``core.plans``)."""
        self.queues_deleting: set[str] = set()
        """Job queues deleted while they had quota shares: DELETED once those are gone."""
        self.loss_suspended: dict[str, int] = {}
        """Pool -> since when (ms) every online node of it has been silent at once: no node of the
        pool is declared lost until one is heard from again (``core.nodes``, "Full disruption")."""
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
            sorted(s.blocked_behind.items()),
            s.backoff,
            sorted(s.plan_extra.items()),
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
            n.incarnation,
            n.last_heartbeat,
            n.training_plan,
            n.plan_closed,
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
        sorted(state.plans.items()),
        sorted(state.plan_windows.items()),
        sorted(state.loss_suspended.items()),
        tuple(state.deadlines),
        sorted((p, sorted(c.items())) for p, c in state.pool_slots.items()),
        sorted((p, sorted(c.items())) for p, c in state.pool_free.items()),
        sorted((k, v) for k, v in state.queue_usage.items() if v),
        sorted((k, tuple(v)) for k, v in state.free_index.items()),
        state.dispatch_counter,
        state.applied,
    )
