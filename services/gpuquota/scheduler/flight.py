"""A scheduler worker's batches of one pool: stepped on the live state, appended, settled (``Pipeline``).

Theory of operation
-------------------
A pool's records of a batch (``Item``: index in the batch, input, position) are handled in three
steps. **Step** (``_step``): below the pool's recorded position a record is skipped, an input twice
in the batch is a duplicate (``_todo``); the rest are stepped one after another on the live state (the
loop's ``StepBatch``), which now runs ahead of the log, and a snapshot due inside the batch is dumped
at its exact sequence. **Record** (``_record``): the batch's entries are appended with their positions
in one transaction after the sequence the step started from; if that fails the state is dropped.
**Settle** (``_settle``): outcomes and recorded positions, then the publications, in decision order,
and the snapshot, saved once they are acknowledged.

Two batches in flight: the append of one batch waits for the database, so the agent starts the next
batch meanwhile (``_start_pool``): if the pool's batch in flight (its ``Tail``) was stepped on the
same state, the new batch is stepped at once on the state the first left, and its record and settle
wait until the first has settled (``_commit``: appends in log order, publications in decision
order). A batch whose state was dropped before it could be recorded (a failed append before it, a
reload) or whose own append failed is redone (``_redo``): decided again on the reloaded state, one
batch after another with each append awaited (``_handle_pool``, the serial path), and a batch started
while a redo is under way first waits for it. A single input is always decided on the serial path
(``_decide``: a duplicate is skipped without a reload), after the pool's batch in flight, and so is
a batch with one input left once the skipped and repeated records are set aside; both through
``_redo``, so every input is decided only while its partition is ours. If a batch
fails for good (the store stayed unreachable, a bug), the batches after it fail with it.

Failures of the append, as in the pipeline's docstring: ``DuplicateInput`` marks the inputs the store
has recorded (``recorded_inputs``) as duplicates and decides the rest again on a reload;
``StaleWriter`` (another worker wrote the pool) drops the state and decides again if the partition is
still ours, at most ``_STALE_RETRIES`` times in a row; ``TransientStoreError`` is retried by the
``Appender`` with back-off.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpuquota.adapters.event_store import DuplicateInput, EventStore, Position, Snapshot, StaleWriter
from gpuquota.scheduler.loop import Appender, LoopFailed, RetryPolicy, StepBatch, answers
from gpuquota.scheduler.pacing import Snapshots
from gpuquota.scheduler.pools import PoolRuntime, Stats
from gpuquota.scheduler.records import RecordPublisher
from gpuquota.support.clock import Clock
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)

_STALE_RETRIES = 3


class Outcome(enum.Enum):
    DECIDED = "decided"
    QUIET = "quiet"
    """Decided nothing (a tick or heartbeat without events): not recorded."""
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    """Below the pool's recorded position: decided before."""
    DEAD_LETTER = "dead-letter"
    NOT_OWNED = "not-owned"


PipelineFailed = LoopFailed
"""The pipeline cannot continue (a publication failed, the store stayed unreachable)."""


class Redo(Exception):
    """Inputs of a batch were recorded before: they are marked; decide the rest again on a reload."""


@dataclass(frozen=True, slots=True)
class Item:
    """A decoded record of a batch: its index in the batch, its input and its position."""

    index: int
    message: SchedulerInput
    position: Position

    @property
    def offset(self) -> int:
        return self.position.next_offset - 1


@dataclass(slots=True)
class Stepped:
    """A pool's batch stepped on the live state, to be appended after ``seq``."""

    runtime: PoolRuntime
    batch: StepBatch[Item]
    seq: int
    snapshot: Snapshot | None
    """Dumped at its exact sequence inside the batch; saved once the batch is settled."""


@dataclass(frozen=True, slots=True)
class Tail:
    """A pool's latest batch in flight: the state it was stepped on and its settling."""

    runtime: PoolRuntime
    done: asyncio.Future[dict[int, Outcome]]


def settled(done: dict[int, Outcome]) -> asyncio.Future[dict[int, Outcome]]:
    future: asyncio.Future[dict[int, Outcome]] = asyncio.get_running_loop().create_future()
    future.set_result(done)
    return future


async def gathered(
    outcomes: list[Outcome], started: list[tuple[list[Item], Awaitable[dict[int, Outcome]]]]
) -> list[Outcome]:
    for items, settling in started:
        done = await settling
        for item in items:
            outcomes[item.index] = done[item.index]
    return outcomes


class BatchFlight:
    """Stepping, recording and settling a pool's batches (a part of ``Pipeline``)."""

    store: EventStore
    retry: RetryPolicy
    stats: Stats
    snapshots: Snapshots
    appender: Appender
    publisher: RecordPublisher
    clock: Clock
    owns: Callable[[str, int], bool]
    _tails: dict[str, Tail]
    runtime: Callable[[str], Awaitable[PoolRuntime]]
    drop: Callable[[str], None]
    _recorded_to: Callable[[str, int], None]
    _decide: Callable[[PoolRuntime, SchedulerInput, Position | None], Awaitable[Outcome]]
    _watch: Callable[[list[Awaitable[object]]], list[Awaitable[object]]]

    async def _start_pool(self, pool: str, items: list[Item]) -> Awaitable[dict[int, Outcome]]:
        """Step ``items`` (one pool's records of a batch, in order) now, behind the pool's batch in
        flight if it was stepped on the same state; outcomes by batch index once settled."""
        tail = self._tails.get(pool)
        if tail is not None and not tail.done.done():
            runtime = await self.runtime(pool)
            if tail.runtime is runtime and len(items) > 1:
                return await self._overlap(runtime, items, tail.done)
            await asyncio.wait([tail.done])  # decide after it: it is being redone, or one input alone
        if len(items) == 1:
            return settled(await self._redo(pool, items, {}))
        return await self._overlap(await self.runtime(pool), items, None)

    async def _overlap(
        self, runtime: PoolRuntime, items: list[Item], before: asyncio.Future[Any] | None
    ) -> Awaitable[dict[int, Outcome]]:
        """Step ``items`` on the pool's live state; record and settle them once ``before`` settled."""
        done: dict[int, Outcome] = {}
        async with runtime.lock:
            todo = [] if runtime.dropped else self._todo(runtime, items, done)
            stepped = self._step(runtime, todo) if len(todo) > 1 else None  # else decided serially
        task = asyncio.create_task(self._commit(runtime, items, done, stepped, before))
        self._tails[runtime.pool] = Tail(runtime, task)
        return task

    async def _commit(
        self,
        runtime: PoolRuntime,
        items: list[Item],
        done: dict[int, Outcome],
        stepped: Stepped | None,
        before: asyncio.Future[Any] | None,
    ) -> dict[int, Outcome]:
        """Append a stepped batch after the one before it, then settle it; redo it if its state was
        dropped meanwhile (a failed append before it, a reload) or its own append failed. A batch
        with one input left to decide (``stepped`` None) is decided on the serial path after it: a
        duplicate is then skipped without a reload."""
        if before is not None:
            await asyncio.wait([before])
            if not before.cancelled() and (exc := before.exception()) is not None:
                raise PipelineFailed(f"pool {runtime.pool}: an earlier batch failed: {exc!r}") from exc
        if stepped is None or runtime.dropped:
            return await self._redo(runtime.pool, items, done)
        try:
            await self._record(stepped, done)
        except Redo:
            return await self._redo(runtime.pool, items, done)
        except StaleWriter as exc:
            self._stale(runtime.pool, exc)
            return await self._redo(runtime.pool, items, done)
        await self._settle(stepped, done)
        return done

    async def _redo(self, pool: str, items: list[Item], done: dict[int, Outcome]) -> dict[int, Outcome]:
        """Decide the items not done yet on the serial path (the pool's state reloaded if it was
        dropped), if their partition is still ours: a lone input, a batch with one input left, a batch
        whose state was dropped or whose append failed."""
        position = items[0].position
        if not self.owns(position.topic, position.partition):
            return {i.index: done.get(i.index, Outcome.NOT_OWNED) for i in items}
        rest = [item for item in items if item.index not in done]
        if rest:
            done.update(await self._handle_pool(pool, rest))
        else:
            await self.runtime(pool)  # held pools are loaded: their ticks go on
        return done

    async def _handle_pool(self, pool: str, items: list[Item]) -> dict[int, Outcome]:
        """Decide ``items`` now, their append awaited (the serial path); outcomes by batch index."""
        done: dict[int, Outcome] = {}
        stale = 0
        while stale < _STALE_RETRIES:
            runtime = await self.runtime(pool)
            async with runtime.lock:
                if runtime.dropped:
                    stale += 1
                    continue  # replaced while we waited for the lock
                try:
                    await self._decide_items(runtime, [i for i in items if i.index not in done], done)
                    return done
                except Redo:
                    continue  # the duplicates are marked done; the state is dropped: reload
                except StaleWriter as exc:
                    self._stale(pool, exc)
                    stale += 1
            topic, partition = items[0].position.topic, items[0].position.partition
            if not self.owns(topic, partition):
                return {i.index: done.get(i.index, Outcome.NOT_OWNED) for i in items}
        raise PipelineFailed(f"pool {pool}: another writer keeps appending to the log")

    def _stale(self, pool: str, exc: StaleWriter) -> None:
        self.stats.stale += 1
        log.warning("pool %s: %s; dropping its state", pool, exc)
        self.drop(pool)

    def _todo(self, runtime: PoolRuntime, items: list[Item], done: dict[int, Outcome]) -> list[Item]:
        """The items to decide: not below the pool's recorded position, each input once."""
        todo: list[Item] = []
        ids: set[str] = set()
        for item in items:
            pos = item.position
            if item.offset < runtime.positions.get((pos.topic, pos.partition), 0):
                self.stats.skipped += 1
                done[item.index] = Outcome.SKIPPED
            elif item.message.event_id in ids:
                self.stats.duplicates += 1  # produced twice and consumed in one batch
                done[item.index] = Outcome.DUPLICATE
            else:
                ids.add(item.message.event_id)
                todo.append(item)
        return todo

    async def _decide_items(self, runtime: PoolRuntime, items: list[Item], done: dict[int, Outcome]) -> None:
        """Skip what was decided before, then decide the rest: alone, or as one batch."""
        todo = self._todo(runtime, items, done)
        if len(todo) == 1:
            (item,) = todo
            done[item.index] = await self._decide(runtime, item.message, item.position)
        elif todo:
            stepped = self._step(runtime, todo)
            await self._record(stepped, done)
            await self._settle(stepped, done)

    def _step(self, runtime: PoolRuntime, items: list[Item]) -> Stepped:
        """Step each input on the live state (which runs ahead of the log until the append)."""
        state, seq = runtime.state, runtime.seq
        batch: StepBatch[Item] = StepBatch(answers(runtime.pool, self.clock))
        entries = batch.entries
        since = runtime.since_snapshot
        snapshot: Snapshot | None = None
        try:
            for item in items:
                if not batch.step(state, item, item.message, item.position):
                    continue  # quiet: not recorded
                since += 1
                if self.snapshots.due(runtime, since):  # at its exact sequence, as one at a time would
                    snapshot = self.snapshots.dump(runtime, seq + len(entries))
                    since = 0
        except BaseException:
            self.drop(runtime.pool)  # the state is ahead of the log
            raise
        runtime.seq, runtime.since_snapshot = seq + len(entries), since
        return Stepped(runtime, batch, seq, snapshot)

    async def _record(self, stepped: Stepped, done: dict[int, Outcome]) -> None:
        """Append a stepped batch's entries in one transaction; drop the state if that fails."""
        pool, entries = stepped.runtime.pool, stepped.batch.entries
        if not entries:
            return
        try:
            self._recorded_to(pool, await self.appender.append_many(pool, stepped.seq, entries))
        except DuplicateInput as exc:
            self.drop(pool)
            await self._mark_recorded(pool, stepped.batch.recorded, done, exc)
            raise Redo() from exc
        except BaseException:
            self.drop(pool)  # whether the batch was recorded, a reload will tell
            raise

    async def _settle(self, stepped: Stepped, done: dict[int, Outcome]) -> None:
        """A recorded batch: its outcomes and positions, then its publications and snapshot."""
        runtime, batch = stepped.runtime, stepped.batch
        for item in batch.quiet:
            self.stats.quiet += 1
            done[item.index] = Outcome.QUIET
        for item in batch.recorded:
            runtime.positions[(item.position.topic, item.position.partition)] = item.position.next_offset
            done[item.index] = Outcome.DECIDED
        runtime.inflight.extend(self._watch(await batch.effects.publish(self.publisher)))
        self.stats.decided += len(batch.recorded)
        self.stats.batches += 1 if batch.entries else 0
        if stepped.snapshot is not None:
            self.snapshots.save(runtime, stepped.snapshot)

    async def _mark_recorded(
        self, pool: str, items: list[Item], done: dict[int, Outcome], exc: DuplicateInput
    ) -> None:
        """Mark the items whose inputs the store has recorded already as duplicates."""
        ids = [item.message.event_id for item in items]
        recorded = await self.retry.call(
            functools.partial(self.store.recorded_inputs, ids), f"pool {pool}: duplicates"
        )
        if not recorded:
            raise StaleWriter(f"pool {pool}: a batch was refused as a duplicate ({exc}), none is recorded")
        for item in items:
            if item.message.event_id in recorded:
                self.stats.duplicates += 1
                done[item.index] = Outcome.DUPLICATE
        log.info(
            "pool %s: %d duplicate input(s) in a batch; reloading to decide the rest", pool, len(recorded)
        )
