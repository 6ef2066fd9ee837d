"""A pool's runtime in the distributed mode (state, sequence, positions) and its paced snapshots.

A snapshot due inside a batch is taken at its exact sequence (the state is dumped between inputs) and
saved once the publications before it are acknowledged by the broker; dumping a large state is paced
(``SnapshotPacing._dump``) so that it takes at most ``snapshot_cpu_share`` of the time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from gpuquota.adapters.event_store import EventStore, Snapshot
from gpuquota.adapters.snapshots import SNAPSHOT_SCHEMA_VERSION, dump_state
from gpuquota.core import ClusterState
from gpuquota.scheduler.loop import LoopFailed, RetryPolicy
from gpuquota.scheduler.pacing import snapshot_pace

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_CHEAP_DUMP_SECONDS = 0.002
"""Dumps under this much CPU are not paced. At 0.02 s, the 10-20 ms dumps of a pool with a few
hundred jobs, due every 1,000 inputs, were 6-8 % of the scheduler at 2,000 jobs/s (py-spy)."""
_MAX_DEFERRAL = 20


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """How a ``Pipeline`` runs its pools (the scheduler service's ``SchedulerConfig`` extends it)."""

    default_pool: str = "default"
    """The pool of records without a key."""
    snapshot_every: int = 1000
    """Recorded inputs between two snapshots of a pool (at their exact sequence)."""
    snapshot_cpu_share: float = 0.02
    """At most this share of the time goes to dumping snapshots (``SnapshotPacing._dump``); recovery
    stays bounded by ``_MAX_DEFERRAL`` x ``snapshot_every`` inputs between snapshots."""
    heartbeat_timeout_ms: int = 30_000
    tick_grace_seconds: float | None = None
    """Seconds after loading a pool before its first tick (default: the heartbeat timeout)."""
    store_retry_seconds: float = 300.0
    """How long an unreachable store is retried before the pipeline says so and stays unready, still
    retrying (or fails, with ``store_give_up``; ``RetryPolicy``)."""
    store_give_up: bool = False
    """Fail the pipeline once the store stayed unreachable ``store_retry_seconds`` (tests; the service
    keeps its process alive, unready, and resumes by itself when the database returns)."""
    retry_initial_seconds: float = 0.05
    retry_max_seconds: float = 2.0
    """The back-off between two tries, from the first to the longest."""


@dataclass
class PoolRuntime:
    pool: str
    state: ClusterState
    seq: int
    positions: dict[TopicPartition, int]
    loaded_at: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dropped: bool = False
    since_snapshot: int = 0
    inflight: list[Awaitable[object]] = field(default_factory=list)
    """Delivery awaitables of publications since the last snapshot."""
    snapshot_after: float = 0.0
    """No snapshot before this ``time.monotonic()`` (dumping a large state is paced, see ``_dump``)."""


@dataclass
class Stats:
    """What the pipeline did since it started, by the ``Outcome`` of each record and more."""

    decided: int = 0
    quiet: int = 0
    """Ticks and heartbeats that decided nothing (not recorded)."""
    duplicates: int = 0
    skipped: int = 0
    """Records below their pool's recorded position (decided before a restart or rebalance)."""
    dead_letters: int = 0
    stale: int = 0
    """Times another writer had appended to a pool's log (``StaleWriter``): its state was dropped."""
    transient_errors: int = 0
    snapshots: int = 0
    loads: int = 0
    """Pools loaded (snapshot and log tail), at assignment or after their state was dropped."""
    republished: int = 0
    """Publications made again by loads (a crash may have lost them)."""
    batches: int = 0
    """Batches of more than one input appended together."""


class SnapshotPacing:
    """Taking and saving a pool's snapshots (a part of ``Pipeline``)."""

    store: EventStore
    retry: RetryPolicy
    stats: Stats
    snapshot_every: int
    snapshot_cpu_share: float
    _background: set[asyncio.Task[None]]

    def _snapshot_due(self, runtime: PoolRuntime, since: int) -> bool:
        if since < self.snapshot_every:
            return False
        return time.monotonic() >= runtime.snapshot_after or since >= self.snapshot_every * _MAX_DEFERRAL

    def _dump(self, runtime: PoolRuntime, seq: int) -> Snapshot:
        """The state as a snapshot at ``seq``; paces the next one if dumping took long.

        Dumping costs in proportion to the state (a long queue), and it runs on the loop: after a
        dump that took more than ``_CHEAP_DUMP_SECONDS`` of this thread's CPU (a large state, not a
        busy machine, since waiting for a CPU does not count) and ``w`` seconds of the loop's time, the
        next waits until ``w / snapshot_cpu_share`` seconds have passed, so snapshots hold the loop at
        most that share of the time; but never beyond ``_MAX_DEFERRAL`` times ``snapshot_every``
        inputs, which bounds the log tail to replay on recovery.
        """
        began, began_cpu = time.monotonic(), time.thread_time()
        data = dump_state(runtime.state)
        if time.thread_time() - began_cpu > _CHEAP_DUMP_SECONDS:
            runtime.snapshot_after = snapshot_pace(began, time.monotonic(), self.snapshot_cpu_share)
        return Snapshot(seq=seq, schema_version=SNAPSHOT_SCHEMA_VERSION, state=data)

    def _snapshot(self, runtime: PoolRuntime, snapshot: Snapshot | None = None) -> None:
        """Save ``snapshot`` (default: of the state now) once the publications so far are delivered."""
        if snapshot is None:  # else the batch that dumped it counted its inputs after it
            snapshot = self._dump(runtime, runtime.seq)
            runtime.since_snapshot = 0
        deliveries, runtime.inflight = runtime.inflight, []
        task = asyncio.create_task(self._save(runtime.pool, snapshot, deliveries))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _save(self, pool: str, snapshot: Snapshot, deliveries: list[Awaitable[object]]) -> None:
        try:
            await asyncio.gather(*deliveries)
        except Exception as exc:
            log.error("pool %s: not saving snapshot %d: a publication failed (%r)", pool, snapshot.seq, exc)
            return
        try:
            await self.retry.call(lambda: self.store.save_snapshot(pool, snapshot), f"pool {pool}: snapshot")
        except LoopFailed as exc:
            log.error("%s", exc)  # only recovery time suffers; the next snapshot tries again
            return
        self.stats.snapshots += 1
