"""The distributed mode's side of one pool's batch driver (``driver.Port``): Kafka records with their
positions and outcomes, the pool's runtime loaded from snapshot and log, its snapshots, publications.

Theory of operation
-------------------
The driver's items are the pool's records of a batch (``pools.Item``), each given its ``Outcome`` here:
``todo`` skips what is below the pool's recorded position (decided before a restart or rebalance) and
an input twice in a batch; ``settle`` records the positions of the recorded inputs, hands their
publications (job states, node commands, input results) to the publisher, and saves the latest
snapshot dumped inside the batch (``stepped`` dumps one due at its exact sequence) once those are
acknowledged. The live state is the worker's ``PoolRuntime`` for the pool: ``live`` loads it (snapshot
and log tail) after a ``drop``. A batch refused as a duplicate has its recorded inputs marked
(``append_failed``); anything but a duplicate or a stale writer fails the batch, and so does a step
that raises (``DISTRIBUTED``: see the driver's docstring for why).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gpuquota.adapters.event_store import DuplicateInput, EventStore, Position, StaleWriter
from gpuquota.scheduler.driver import Mode, Settled
from gpuquota.scheduler.loop import Answerer, LoopFailed, RetryPolicy, StepBatch, answers
from gpuquota.scheduler.pacing import Snapshots
from gpuquota.scheduler.pools import Item, Outcome, PoolRuntime, Stats
from gpuquota.scheduler.records import RecordPublisher
from gpuquota.support.clock import Clock
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)

DISTRIBUTED = Mode(appends_at_once=False, redo_each=False, step_errors_fail=True)

PipelineFailed = LoopFailed
"""The pipeline cannot continue (a publication failed, the store stayed unreachable)."""


class Worker(Protocol):
    """What the port uses of the worker that holds the pool (``pipeline.Pipeline``)."""

    store: EventStore
    retry: RetryPolicy
    publisher: RecordPublisher
    clock: Clock
    stats: Stats
    snapshots: Snapshots
    runtimes: dict[str, PoolRuntime]

    @property
    def owns(self) -> Callable[[str, int], bool]:
        """Whether a topic's partition is still this worker's."""
        ...

    async def runtime(self, pool: str) -> PoolRuntime: ...

    def drop(self, pool: str) -> None: ...

    def stale(self, pool: str, exc: StaleWriter) -> None: ...

    def recorded_to(self, pool: str, seq: int) -> None: ...

    def watch(self, deliveries: list[Awaitable[object]]) -> list[Awaitable[object]]: ...


class PoolPort:
    """The distributed mode's side of one pool's driver (``driver.Port``): Kafka records with their
    positions and outcomes, the pool's runtime loaded from snapshot and log, snapshots, publications."""

    mode = DISTRIBUTED
    failure = None  # a failed publication fails the next batch (``Pipeline._check``)

    def __init__(self, pipeline: Worker, pool: str) -> None:
        self.pipeline = pipeline
        self.pool = pool
        self.answer: Answerer | None = answers(pool, pipeline.clock)

    def message(self, item: Item) -> SchedulerInput:
        return item.message

    def position(self, item: Item) -> Position | None:
        return item.position

    def done(self, item: Item) -> bool:
        return item.outcome is not None

    async def live(self) -> PoolRuntime:
        return await self.pipeline.runtime(self.pool)

    def drop(self, live: PoolRuntime) -> None:
        if self.pipeline.runtimes.get(self.pool) is live:
            self.pipeline.drop(self.pool)
        live.dropped = True

    def serial(self, items: Sequence[Item]) -> bool:
        """A lone input is decided with its append awaited: a duplicate then costs no reload."""
        return len(items) <= 1

    def todo(self, live: PoolRuntime, items: Sequence[Item]) -> list[Item]:
        """The items to decide: not below the pool's recorded position, each input once."""
        stats, todo, ids = self.pipeline.stats, [], set()
        for item in items:
            pos = item.position
            if item.outcome is not None:
                continue
            if pos is not None and pos.next_offset - 1 < live.positions.get((pos.topic, pos.partition), 0):
                stats.skipped += 1
                item.outcome = Outcome.SKIPPED
            elif item.message.event_id in ids:
                stats.duplicates += 1  # produced twice and consumed in one batch
                item.outcome = Outcome.DUPLICATE
            else:
                ids.add(item.message.event_id)
                todo.append(item)
        return todo

    def disowned(self, items: Sequence[Item]) -> bool:
        position = items[0].position
        if position is None or self.pipeline.owns(position.topic, position.partition):
            return False
        for item in items:
            item.outcome = item.outcome or Outcome.NOT_OWNED
        return True

    def stepped(self, live: PoolRuntime, seq: int) -> None:
        """Count a recorded input; dump a snapshot due at its exact sequence, as one at a time would."""
        snapshots = self.pipeline.snapshots
        live.since_snapshot += 1
        if snapshots.due(live, live.since_snapshot):
            live.dumped.append(snapshots.dump(live, seq))
            live.since_snapshot = 0

    async def settle(self, live: PoolRuntime, settled: Settled[Item]) -> None:
        """Outcomes and positions, then the publications, then the snapshots dumped up to it."""
        pipeline, batch = self.pipeline, settled.batch
        stats = pipeline.stats
        for item in batch.quiet:
            stats.quiet += 1
            item.outcome = Outcome.QUIET
        if settled.seq is not None:
            pipeline.recorded_to(self.pool, settled.seq)
        for item in batch.recorded:
            if (pos := item.position) is not None:
                live.positions[(pos.topic, pos.partition)] = pos.next_offset
            item.outcome = Outcome.DECIDED
        live.inflight.extend(pipeline.watch(await batch.effects.publish(pipeline.publisher)))
        stats.decided += len(batch.recorded)
        stats.batches += 1 if settled.grouped and batch.entries else 0
        due = [s for s in live.dumped if settled.seq is not None and s.seq <= settled.seq]
        live.dumped = [s for s in live.dumped if s not in due]
        if due:  # the latest covers the others
            pipeline.snapshots.save(live, due[-1])

    async def append_failed(self, live: PoolRuntime, batch: StepBatch[Item], exc: Exception) -> bool:
        """``DuplicateInput``: mark the inputs the store has recorded already (True); ``StaleWriter``:
        decide again (False); anything else fails the batch."""
        if isinstance(exc, StaleWriter):
            return False
        if not isinstance(exc, DuplicateInput):
            raise exc
        pipeline, pool = self.pipeline, self.pool
        ids = [item.message.event_id for item in batch.recorded]
        store = pipeline.store
        recorded = await pipeline.retry.call(
            functools.partial(store.recorded_inputs, ids), f"pool {pool}: duplicates"
        )
        if not recorded:
            raise StaleWriter(f"pool {pool}: a batch was refused as a duplicate ({exc}), none is recorded")
        for item in batch.recorded:
            if item.message.event_id in recorded:
                pipeline.stats.duplicates += 1
                item.outcome = Outcome.DUPLICATE
        log.info(
            "pool %s: %d duplicate input(s) in a batch; reloading to decide the rest", pool, len(recorded)
        )
        return True

    def duplicate(self, item: Item) -> None:
        self.pipeline.stats.duplicates += 1
        item.outcome = Outcome.DUPLICATE

    def stale(self, exc: StaleWriter) -> None:
        self.pipeline.stale(self.pool, exc)

    def failed(self, item: Item, exc: Exception) -> None:
        raise exc

    def abandon(self, items: Sequence[Item], exc: BaseException) -> None:
        raise PipelineFailed(f"pool {self.pool}: an earlier batch failed: {exc!r}") from exc
