"""What a distributed scheduler worker keeps of each pool it holds: its runtime (the batch driver's live
state, with its positions and snapshot bookkeeping), the records of a batch (``Item``) and their
``Outcome``, the worker's settings and statistics. Its snapshots are ``scheduler.pacing.Snapshots``."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from gpuquota.adapters.event_store import Position, Snapshot
from gpuquota.core import DEFAULT_POLICY, ClusterState
from gpuquota.wire.inputs import SchedulerInput

TopicPartition = tuple[str, int]


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """How a ``Pipeline`` runs its pools (the scheduler service's ``SchedulerConfig`` extends it)."""

    default_pool: str = "default"
    """The pool of records without a key."""
    snapshot_every: int = 1000
    """Recorded inputs between two snapshots of a pool (at their exact sequence)."""
    snapshot_cpu_share: float = 0.02
    """At most this share of the time goes to dumping snapshots (``pacing.Snapshots.dump``);
    recovery stays bounded by ``pacing._MAX_DEFERRAL`` x ``snapshot_every`` inputs between snapshots."""
    heartbeat_timeout_ms: int = DEFAULT_POLICY.heartbeat_timeout_ms
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


class Outcome(enum.Enum):
    DECIDED = "decided"
    QUIET = "quiet"
    """Decided nothing (a tick or heartbeat without events): not recorded."""
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    """Below the pool's recorded position: decided before."""
    DEAD_LETTER = "dead-letter"
    NOT_OWNED = "not-owned"


@dataclass(slots=True, eq=False)
class Item:
    """A decoded record of a batch (the driver's item): its index in the batch, its input and its
    position (None: a tick), and its outcome once it has one."""

    index: int
    message: SchedulerInput
    position: Position | None
    outcome: Outcome | None = None


@dataclass(eq=False)
class PoolRuntime:
    """A pool's live state (``driver.Live``) with its recorded positions and snapshot bookkeeping."""

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
    """No snapshot before this ``time.monotonic()`` (large states are paced: ``scheduler.pacing``)."""
    dumped: list[Snapshot] = field(default_factory=list)
    """Snapshots dumped at their exact sequence while stepping, saved once their batch has settled."""


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
