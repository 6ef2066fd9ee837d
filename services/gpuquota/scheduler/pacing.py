"""A scheduler worker's snapshots of its pools: when one is due, dumped at its exact sequence, paced,
and saved once the publications before it are delivered (``Snapshots``, held by ``Pipeline``).

Theory of operation
-------------------
A pool's snapshot is due every ``snapshot_every`` recorded inputs. One due inside a batch is dumped at
its exact sequence (between two inputs, as one at a time would) and saved only once the publications
up to it are acknowledged by the broker, so nothing before a snapshot needs publishing again.
Dumping costs in proportion to the state and runs on the event loop, so a large state's dumps are
paced (``snapshot_pace``) to hold the loop at most ``snapshot_cpu_share`` of the time, but deferred
never beyond ``_MAX_DEFERRAL`` x ``snapshot_every`` inputs, which bounds the log tail to replay on
recovery. A snapshot that cannot be saved costs only recovery time: the next one tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable

from gpuquota.adapters.event_store import EventStore, Snapshot
from gpuquota.adapters.snapshots import SNAPSHOT_SCHEMA_VERSION, dump_state
from gpuquota.scheduler.loop import LoopFailed, RetryPolicy
from gpuquota.scheduler.pools import PoolRuntime, Stats

log = logging.getLogger(__name__)

_CHEAP_DUMP_SECONDS = 0.002
"""Dumps under this much CPU are not paced. At 0.02 s, the 10-20 ms dumps of a pool with a few
hundred jobs, due every 1,000 inputs, were 6-8 % of the scheduler at 2,000 jobs/s (py-spy)."""
_MAX_DEFERRAL = 20


def snapshot_pace(began: float, ended: float, share: float) -> float:
    """When the next snapshot may be dumped, after one that held the event loop from ``began`` to
    ``ended`` (``time.monotonic``), so that dumps hold the loop at most ``share`` of the time.

    The loop's time, not the thread's CPU, is what the waiting inputs see: on a machine that gives the
    scheduler half a CPU, a dump holds the loop twice its CPU time. Paced by CPU, a backlog's ever
    larger state was dumped ever more often (py-spy: 10 % of the scheduler at 1,000 jobs/s offered on a
    loaded machine), which slowed the draining of the backlog that made it large.
    """
    return ended + (ended - began) / share


class Snapshots:
    """Taking and saving the snapshots of one worker's pools."""

    def __init__(
        self, store: EventStore, retry: RetryPolicy, stats: Stats, *, every: int, cpu_share: float
    ) -> None:
        self.store = store
        self.retry = retry
        self.stats = stats
        self.every = max(1, every)
        self.cpu_share = min(1.0, max(0.001, cpu_share))
        self.saving: set[asyncio.Task[None]] = set()
        """Snapshots waiting for their publications' delivery or being written."""

    def due(self, runtime: PoolRuntime, since: int) -> bool:
        """Whether a snapshot is due after ``since`` inputs recorded since the pool's last one."""
        if since < self.every:
            return False
        return time.monotonic() >= runtime.snapshot_after or since >= self.every * _MAX_DEFERRAL

    def dump(self, runtime: PoolRuntime, seq: int) -> Snapshot:
        """The state as a snapshot at ``seq``; paces the next one if dumping took long.

        After a dump that took more than ``_CHEAP_DUMP_SECONDS`` of this thread's CPU (a large state,
        not a busy machine, since waiting for a CPU does not count) and ``w`` seconds of the loop's
        time, the next waits until ``w / cpu_share`` seconds have passed.
        """
        began, began_cpu = time.monotonic(), time.thread_time()
        data = dump_state(runtime.state)
        if time.thread_time() - began_cpu > _CHEAP_DUMP_SECONDS:
            runtime.snapshot_after = snapshot_pace(began, time.monotonic(), self.cpu_share)
        return Snapshot(seq=seq, schema_version=SNAPSHOT_SCHEMA_VERSION, state=data)

    def save(self, runtime: PoolRuntime, snapshot: Snapshot | None = None) -> None:
        """Save ``snapshot`` (default: of the state now) once the publications so far are delivered."""
        if snapshot is None:  # else the batch that dumped it counted its inputs after it
            snapshot = self.dump(runtime, runtime.seq)
            runtime.since_snapshot = 0
        deliveries, runtime.inflight = runtime.inflight, []
        task = asyncio.create_task(self._save(runtime.pool, snapshot, deliveries))
        self.saving.add(task)
        task.add_done_callback(self.saving.discard)

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

    async def flush(self) -> None:
        """Wait for every snapshot being saved."""
        while self.saving:
            await asyncio.gather(*list(self.saving), return_exceptions=True)

    async def close(self) -> None:
        """Cancel the snapshots not saved yet."""
        for task in list(self.saving):
            task.cancel()
        for task in list(self.saving):
            with contextlib.suppress(asyncio.CancelledError):
                await task
