"""The distributed scheduler's processing of one input record, independent of the Kafka client.

Theory of operation
-------------------
Inputs arrive from ``gpuquota.scheduler.inputs`` keyed by pool; one partition carries whole pools, so
the worker that owns a partition is the single writer of its pools' logs. ``Pipeline.handle_batch``
is the loop body of the scheduler agent; it takes the records that are already there (up to a few
hundred) and handles them per pool, in order, as below, except that the decided inputs of a pool are
appended together (group commit, see "Batches"). ``handle(record)`` is a batch of one:

1. decode: the key is the pool (keyless records belong to ``default_pool``); the value must be a
   ``SchedulerInput``. Anything else becomes a ``DeadLetter`` (original bytes, reason, position) and
   processing continues with the next record.
2. skip what is already decided: a record below the pool's recorded position (the next offset stored
   with its last decided input) was applied before a restart or rebalance.
3. ``decide`` on the pool's state, then ``append`` the input, its events and the record's position in
   one store transaction. ``DuplicateInput``: the same input was recorded before (a re-produced or
   redelivered message): skip it. ``StaleWriter``: another worker wrote the pool: drop the state;
   if the partition is still ours, rebuild it from the store and decide the record again, otherwise
   stop (the partition moved; it is rebuilt when it is assigned here again).
   ``TransientStoreError``: the store is unreachable: retry the same append with back-off and decide
   nothing else meanwhile (the pool's lock is held), for at most ``store_retry_seconds``, then fail.
4. ``evolve`` the state, deriving node commands from the state *before* each event.
5. publish job events to ``gpuquota.job-state`` (key job id) and node commands to
   ``gpuquota.node-commands`` (key node id); each record carries its event id (``event_id``), and a
   job event the id of the input that caused it (header ``input_event_id``). The input's answer, an
   ``InputResult`` (``gpuquota.wire.input_results``), goes to ``gpuquota.input-results`` (key pool)
   with them; a dead-lettered record that names an ``event_id`` is answered there too (REJECTED).
   A redelivered input is skipped (2, 3) and so never answered twice.

Publishing happens after the append, so a crash between the two loses publications, never decisions.
Recovery closes that gap: loading a pool folds the latest snapshot plus the log after it and publishes
the tail's job events and input results again, and its node commands that still matter (a
``RunAttempt`` whose attempt is still only SCHEDULED, every ``StopAttempt``, a ``RegisterAgain`` while
its node is still lost). A
snapshot is saved only once every publication up to its sequence is acknowledged by the broker, so
nothing before a snapshot needs publishing again.
Consumers therefore see each event at least once and de-duplicate by event id; node agents ignore a
``RunAttempt`` they already ran and a ``StopAttempt`` for an attempt they do not run.

Batches: the records of one pool in a batch (below its recorded position: skipped; an input twice in the
batch: the second is a duplicate) are decided one after another on the live state, each input's events
evolved before the next is decided (node commands and job records derived from the state before each
event), then appended with their positions by ONE ``append_many`` (one transaction, one round trip), and
only then published, all in decision order; the agent acks the records afterwards. A snapshot due inside
a batch is taken at its exact sequence (the state is dumped between inputs) and saved after the batch's
publications are acknowledged; dumping a large state is paced (``_dump``). The state runs ahead of the
log until the append commits, so any failure of the append drops the pool's state: ``DuplicateInput``
(an input of the batch was recorded before: ``recorded_inputs`` names every such input, they are
skipped) and ``StaleWriter`` reload the pool from the store and decide the rest of the batch again, as
above; ``TransientStoreError`` retries the same batch (if a retry finds the batch recorded, it had
committed). Nothing is published for a batch that is not recorded.

Ticks (``tick()``) are decided directly through the same path (decide, append, publish) for the pools
this worker holds, once a pool has been loaded for ``tick_grace_seconds``: a scheduler that was down
must first read the heartbeats queued meanwhile before it may declare nodes lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pydantic import ValidationError

from gpuquota.adapters.event_store import (
    BatchEntry,
    DuplicateInput,
    EventStore,
    Position,
    Snapshot,
    StaleWriter,
    TransientStoreError,
)
from gpuquota.adapters.snapshots import SNAPSHOT_SCHEMA_VERSION, SnapshotError, dump_state, load_state
from gpuquota.commands import node_commands
from gpuquota.core import ClusterState, decide, evolve, step
from gpuquota.scheduler.pacing import snapshot_pace
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobStatus
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.input_results import InputResult, result_of, result_of_undecodable
from gpuquota.wire.inputs import INPUT_ADAPTER, SchedulerInput
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt

log = logging.getLogger(__name__)

_T = TypeVar("_T")
Clock = Callable[[], int]
ShareKey = tuple[str, str]
TopicPartition = tuple[str, int]

_POOL = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_QUIET_INPUTS = (inp.Tick, inp.NodeHeartbeat)
_STALE_RETRIES = 3
_CHEAP_DUMP_SECONDS = 0.02
_MAX_DEFERRAL = 20


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class JobStateRecord:
    """A job event to publish, with the job's (queue, share) for the record's headers."""

    event: SchedulerEvent
    share: ShareKey | None
    cause: str | None = None
    """The event id of the input that caused the event (header ``input_event_id``)."""


class Publisher(Protocol):
    async def publish(
        self,
        records: Sequence[JobStateRecord],
        commands: Sequence[NodeCommand],
        results: Sequence[InputResult] = (),
    ) -> list[Awaitable[object]]:
        """Hand the records to the producer, in order; return one delivery awaitable per record."""
        ...

    async def dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        """Produce ``letter`` to the dead-letter topic and wait until the broker has it."""
        ...


class Outcome(enum.Enum):
    DECIDED = "decided"
    QUIET = "quiet"
    """Decided nothing (a tick or heartbeat without events): not recorded."""
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"
    """Below the pool's recorded position: decided before."""
    DEAD_LETTER = "dead-letter"
    NOT_OWNED = "not-owned"


class PipelineFailed(Exception):
    """The pipeline cannot continue (a publication failed, the store stayed unreachable)."""


class _Redo(Exception):
    """Inputs of a batch were recorded before: they are marked; decide the rest again on a reload."""


@dataclass(frozen=True, slots=True)
class _Item:
    """A decoded record of a batch: its index in the batch, its input and its position."""

    index: int
    message: SchedulerInput
    position: Position

    @property
    def offset(self) -> int:
        return self.position.next_offset - 1


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
    decided: int = 0
    quiet: int = 0
    duplicates: int = 0
    skipped: int = 0
    dead_letters: int = 0
    stale: int = 0
    transient_errors: int = 0
    snapshots: int = 0
    loads: int = 0
    republished: int = 0
    batches: int = 0
    """Batches of more than one input appended together."""


def decode(record: SourceRecord, default_pool: str) -> tuple[str, SchedulerInput] | str:
    """``(pool, input)``, or the reason the record is a dead letter."""
    if record.key is None:
        pool = default_pool
    else:
        try:
            pool = record.key.decode("utf-8")
        except UnicodeDecodeError:
            return "invalid key: not UTF-8 (the key must be the pool name)"
        if not _POOL.match(pool):
            return f"invalid key {pool[:200]!r}: not a pool name"
    try:
        return pool, INPUT_ADAPTER.validate_json(record.value)
    except ValidationError as exc:
        return rejection_reason(exc)


def rejection_reason(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if not errors:
        return f"invalid: {exc}"
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        return f"malformed JSON: {first['msg']}"
    if kind == "union_tag_invalid":
        tag = (first.get("ctx") or {}).get("tag", "?")
        return f"unknown message type {tag!r}"
    if kind == "union_tag_not_found":
        return "no message type: the 'type' field is missing"
    details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:10])
    return f"schema violation: {details}"


class Pipeline:
    """Per-pool states of one scheduler worker; see the module docstring."""

    def __init__(
        self,
        store: EventStore,
        publisher: Publisher,
        *,
        default_pool: str = "default",
        snapshot_every: int = 1000,
        snapshot_cpu_share: float = 0.05,
        heartbeat_timeout_ms: int = 30_000,
        tick_grace_seconds: float | None = None,
        store_retry_seconds: float = 300.0,
        retry_initial_seconds: float = 0.05,
        retry_max_seconds: float = 2.0,
        clock: Clock = wall_clock_ms,
        owns: Callable[[str, int], bool] = lambda topic, partition: True,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.default_pool = default_pool
        self.snapshot_every = max(1, snapshot_every)
        self.snapshot_cpu_share = min(1.0, max(0.001, snapshot_cpu_share))
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.tick_grace_seconds = (
            heartbeat_timeout_ms / 1000 if tick_grace_seconds is None else tick_grace_seconds
        )
        self.store_retry_seconds = store_retry_seconds
        self.retry_initial = retry_initial_seconds
        self.retry_max = retry_max_seconds
        self.clock = clock
        self.owns = owns
        self.runtimes: dict[str, PoolRuntime] = {}
        self.stats = Stats()
        self.store_available = True
        """False while an append or load is retrying a ``TransientStoreError``."""
        self._loading: dict[str, asyncio.Lock] = {}
        self._partitions: dict[str, TopicPartition] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    # ----- the agent's loop body ---------------------------------------------------------------

    async def handle(self, record: SourceRecord) -> Outcome:
        """Handle one record (a batch of one)."""
        (outcome,) = await self.handle_batch([record])
        return outcome

    async def handle_batch(self, records: Sequence[SourceRecord]) -> list[Outcome]:
        """Handle records consumed together, in order per pool; one outcome per record."""
        self._check()
        outcomes: list[Outcome] = [Outcome.DEAD_LETTER] * len(records)
        pools: dict[str, list[_Item]] = {}
        for index, record in enumerate(records):
            decoded = decode(record, self.default_pool)
            if isinstance(decoded, str):
                await self._dead_letter(record, decoded)
                continue
            pool, message = decoded
            self._partitions[pool] = (record.topic, record.partition)
            position = Position(record.topic, record.partition, record.offset + 1)
            pools.setdefault(pool, []).append(_Item(index, message, position))
        for pool, items in pools.items():
            done = await self._handle_pool(pool, items)
            for item in items:
                outcomes[item.index] = done[item.index]
        return outcomes

    async def _handle_pool(self, pool: str, items: list[_Item]) -> dict[int, Outcome]:
        """Decide ``items`` (one pool's records of a batch, in order); outcomes by batch index."""
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
                except _Redo:
                    continue  # the duplicates are marked done; the state is dropped: reload
                except StaleWriter as exc:
                    self.stats.stale += 1
                    log.warning("pool %s: %s; dropping its state", pool, exc)
                    self.drop(pool)
                    stale += 1
            topic, partition = items[0].position.topic, items[0].position.partition
            if not self.owns(topic, partition):
                return {i.index: done.get(i.index, Outcome.NOT_OWNED) for i in items}
        raise PipelineFailed(f"pool {pool}: another writer keeps appending to the log")

    async def _decide_items(self, runtime: PoolRuntime, items: list[_Item], done: dict[int, Outcome]) -> None:
        """Skip what was decided before, then decide the rest: alone, or as one batch."""
        todo: list[_Item] = []
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
        if len(todo) == 1:
            (item,) = todo
            done[item.index] = await self._decide(runtime, item.message, item.position)
        elif todo:
            await self._decide_batch(runtime, todo, done)

    async def _decide_batch(self, runtime: PoolRuntime, items: list[_Item], done: dict[int, Outcome]) -> None:
        """Step each input on the live state, append them all in one transaction, then publish."""
        state = runtime.state
        entries: list[BatchEntry] = []
        decided: list[_Item] = []
        quiet: list[_Item] = []
        records: list[JobStateRecord] = []
        commands: list[NodeCommand] = []
        results: list[InputResult] = []
        since = runtime.since_snapshot
        snapshot: Snapshot | None = None
        cause = ""

        def before(state: ClusterState, event: SchedulerEvent) -> None:
            records.extend(_job_state(state, event, cause))
            commands.extend(node_commands(state, event))

        try:
            for item in items:
                cause = item.message.event_id
                events = step(state, item.message, before)  # decided and applied: the log is behind
                if not events and isinstance(item.message, _QUIET_INPUTS):
                    quiet.append(item)
                    continue
                results.extend(_result(item.message, events, runtime.pool, self.clock()))
                entries.append((item.message, events, item.position))
                decided.append(item)
                since += 1
                if self._snapshot_due(runtime, since):  # at its exact sequence, as one at a time would
                    snapshot = self._dump(runtime, runtime.seq + len(entries))
                    since = 0
        except BaseException:
            self.drop(runtime.pool)  # the state is ahead of the log
            raise
        if entries:
            try:
                runtime.seq = await self._append_many(runtime, entries)
            except DuplicateInput as exc:
                self.drop(runtime.pool)
                await self._mark_recorded(runtime.pool, decided, done, exc)
                raise _Redo() from exc
            except BaseException:
                self.drop(runtime.pool)  # whether the batch was recorded, a reload will tell
                raise
        for item in quiet:
            self.stats.quiet += 1
            done[item.index] = Outcome.QUIET
        for item in decided:
            runtime.positions[(item.position.topic, item.position.partition)] = item.position.next_offset
            done[item.index] = Outcome.DECIDED
        if records or commands or results:
            runtime.inflight.extend(self._watch(await self.publisher.publish(records, commands, results)))
        self.stats.decided += len(decided)
        self.stats.batches += 1 if entries else 0
        runtime.since_snapshot = since
        if snapshot is not None:
            self._snapshot(runtime, snapshot)

    async def _mark_recorded(
        self, pool: str, items: list[_Item], done: dict[int, Outcome], exc: DuplicateInput
    ) -> None:
        """Mark the items whose inputs the store has recorded already as duplicates."""
        ids = [item.message.event_id for item in items]
        recorded = await self._with_retry(
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

    async def tick(self) -> None:
        """Decide a ``Tick`` for every pool held here (and past its grace period) that is idle."""
        self._check()
        now = time.monotonic()
        for pool, runtime in list(self.runtimes.items()):
            if runtime.lock.locked() or now - runtime.loaded_at < self.tick_grace_seconds:
                continue
            async with runtime.lock:
                if runtime.dropped:
                    continue
                message = inp.Tick(event_id=f"tick/{pool}/{uuid.uuid4()}", occurred_at=self.clock())
                try:
                    await self._decide(runtime, message, None)
                except StaleWriter as exc:
                    self.stats.stale += 1
                    log.warning("pool %s: %s; dropping its state", pool, exc)
                    self.drop(pool)

    # ----- partitions ----------------------------------------------------------------------------

    async def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """Load the pools recorded on newly assigned partitions (recovery; starts their ticks)."""
        for topic, partition in partitions:
            pools = await self._with_retry(
                functools.partial(self.store.pools_at, topic, partition), f"partition {partition}"
            )
            for pool in pools:
                self._partitions.setdefault(pool, (topic, partition))
                await self.runtime(pool)

    def retain(self, held: Iterable[TopicPartition]) -> None:
        """Forget the pools of partitions not in ``held`` (they moved to another worker)."""
        keep = set(held)
        for pool in list(self.runtimes):
            if self._partitions.get(pool) not in keep:
                self.drop(pool)

    def drop(self, pool: str) -> None:
        runtime = self.runtimes.pop(pool, None)
        if runtime is not None:
            runtime.dropped = True

    # ----- recovery ----------------------------------------------------------------------------

    async def runtime(self, pool: str) -> PoolRuntime:
        """The pool's state, loaded (snapshot + log tail) on first use."""
        runtime = self.runtimes.get(pool)
        if runtime is not None:
            return runtime
        async with self._loading.setdefault(pool, asyncio.Lock()):
            runtime = self.runtimes.get(pool)
            if runtime is None:
                runtime = await self._with_retry(lambda: self._load(pool), f"pool {pool}: load")
                self.runtimes[pool] = runtime
            return runtime

    async def _load(self, pool: str) -> PoolRuntime:
        state, seq = ClusterState(self.heartbeat_timeout_ms), 0
        snapshot = await self.store.latest_snapshot(pool)
        if snapshot is not None:
            try:
                state, seq = load_state(snapshot.state), snapshot.seq
            except SnapshotError as exc:
                log.warning("pool %s: ignoring snapshot at %d: %s", pool, snapshot.seq, exc)
        records: list[JobStateRecord] = []
        commands: list[NodeCommand] = []
        results: list[InputResult] = []
        tail = 0
        while batch := await self.store.read(pool, after_seq=seq):
            for record in batch:
                results.extend(_result(record.input, record.events, pool, self.clock()))
                for event in record.events:
                    records.extend(_job_state(state, event, record.input.event_id))
                    commands.extend(node_commands(state, event))
                    evolve(state, event)
                seq = record.seq
                tail += 1
        runtime = PoolRuntime(pool, state, seq, await self.store.positions(pool))
        needed = [c for c in commands if _still_needed(state, c)]
        if records or needed or results:
            runtime.inflight.extend(self._watch(await self.publisher.publish(records, needed, results)))
            self.stats.republished += len(records) + len(needed) + len(results)
        self.stats.loads += 1
        log.info(
            "pool %s: loaded at sequence %d (snapshot %s, %d records after it; republished %d)",
            pool, seq, None if snapshot is None else snapshot.seq, tail, len(records) + len(needed),
        )  # fmt: skip
        # a long tail is snapshotted with the next decided input (as due), not here: dumping a large
        # state would double the time before the pool decides again
        runtime.since_snapshot = tail
        return runtime

    # ----- deciding ----------------------------------------------------------------------------

    async def _decide(
        self, runtime: PoolRuntime, message: SchedulerInput, position: Position | None
    ) -> Outcome:
        events = decide(runtime.state, message)
        if not events and isinstance(message, _QUIET_INPUTS):
            self.stats.quiet += 1
            return Outcome.QUIET
        try:
            runtime.seq = await self._append(runtime, message, events, position)
        except DuplicateInput:
            self.stats.duplicates += 1
            return Outcome.DUPLICATE
        if position is not None:
            runtime.positions[(position.topic, position.partition)] = position.next_offset
        records: list[JobStateRecord] = []
        commands: list[NodeCommand] = []
        results = _result(message, events, runtime.pool, self.clock())
        for event in events:
            records.extend(_job_state(runtime.state, event, message.event_id))
            commands.extend(node_commands(runtime.state, event))
            evolve(runtime.state, event)
        if records or commands or results:
            runtime.inflight.extend(self._watch(await self.publisher.publish(records, commands, results)))
        self.stats.decided += 1
        runtime.since_snapshot += 1
        if self._snapshot_due(runtime, runtime.since_snapshot):
            self._snapshot(runtime)
        return Outcome.DECIDED

    async def _append(
        self,
        runtime: PoolRuntime,
        message: SchedulerInput,
        events: Sequence[SchedulerEvent],
        position: Position | None,
    ) -> int:
        return await self._retried_append(
            runtime,
            [message.event_id],
            lambda: self.store.append(runtime.pool, runtime.seq, message, events, position),
        )

    async def _append_many(self, runtime: PoolRuntime, entries: list[BatchEntry]) -> int:
        """``append_many`` with the retries of ``_append``; the batch's last sequence."""
        return await self._retried_append(
            runtime,
            [message.event_id for message, _, _ in entries],
            lambda: self.store.append_many(runtime.pool, runtime.seq, entries),
        )

    async def _retried_append(
        self, runtime: PoolRuntime, input_ids: list[str], append: Callable[[], Awaitable[int]]
    ) -> int:
        """``append()`` of ``input_ids`` after ``runtime.seq``, retried like every store call.

        A ``DuplicateInput`` after a failed try means that try had committed in transit if the log's
        next records are exactly these inputs: that is success, not a duplicate.
        """
        tries = 0

        async def attempt() -> int:
            nonlocal tries
            tries += 1
            try:
                return await append()
            except DuplicateInput:
                if tries > 1 and await self._recorded_next(runtime, *input_ids):
                    return runtime.seq + len(input_ids)
                raise

        return await self._with_retry(attempt, f"pool {runtime.pool}: append")

    async def _recorded_next(self, runtime: PoolRuntime, *input_ids: str) -> bool:
        """Whether the log's next records after ``runtime.seq`` are ``input_ids``, in order."""
        following = await self.store.read(runtime.pool, after_seq=runtime.seq, limit=len(input_ids))
        return [record.input.event_id for record in following] == list(input_ids)

    async def _with_retry(self, call: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``call()``, retried with back-off while the store is unreachable (``TransientStoreError``),
        deciding nothing meanwhile, for at most ``store_retry_seconds``; then ``PipelineFailed``."""
        delay = self.retry_initial
        deadline = time.monotonic() + self.store_retry_seconds
        while True:
            try:
                result = await call()
                self.store_available = True
                return result
            except TransientStoreError as exc:
                self._unavailable(exc, deadline, what)
                await asyncio.sleep(delay)  # back-off before retrying
                delay = min(delay * 2, self.retry_max)

    def _unavailable(self, exc: TransientStoreError, deadline: float, what: str) -> None:
        self.stats.transient_errors += 1
        if self.store_available:
            log.warning("%s: store unavailable (%s); retrying, deciding nothing meanwhile", what, exc)
        self.store_available = False
        if time.monotonic() > deadline:
            raise PipelineFailed(f"{what}: store unavailable for {self.store_retry_seconds:g} s") from exc

    # ----- publications and snapshots ----------------------------------------------------------

    def _watch(self, deliveries: list[Awaitable[object]]) -> list[Awaitable[object]]:
        """Fail the pipeline as soon as a delivery fails (its exception is retrieved here)."""
        for delivery in deliveries:
            if isinstance(delivery, asyncio.Future):
                delivery.add_done_callback(self._delivered)
        return deliveries

    def _delivered(self, future: asyncio.Future[object]) -> None:
        if future.cancelled():
            return
        if (exc := future.exception()) is not None and self._failure is None:
            log.error("publishing failed: %r", exc)
            self._failure = exc

    def _check(self) -> None:
        if self._failure is not None:
            raise PipelineFailed(f"publishing failed: {self._failure!r}") from self._failure

    async def _dead_letter(self, record: SourceRecord, reason: str) -> None:
        letter = DeadLetter.of(
            record.value,
            reason=reason,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            occurred_at=self.clock(),
        )
        log.warning("dead letter %s/%d@%d: %s", record.topic, record.partition, record.offset, reason)
        await self.publisher.dead_letter(letter, record.key)
        self.stats.dead_letters += 1
        pool = self._pool_of(record.key)
        answer = None if pool is None else result_of_undecodable(record.value, reason, pool, self.clock())
        if answer is not None:  # the producer waits for an answer to its event id
            await asyncio.gather(*await self.publisher.publish([], [], [answer]))

    def _pool_of(self, key: bytes | None) -> str | None:
        """The pool a record's key names, or None if it names none."""
        if key is None:
            return self.default_pool
        pool = key.decode("utf-8", errors="replace")
        return pool if _POOL.match(pool) else None

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
        if snapshot is None:
            snapshot = self._dump(runtime, runtime.seq)
        deliveries, runtime.inflight = runtime.inflight, []
        runtime.since_snapshot = 0
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
            await self._with_retry(lambda: self.store.save_snapshot(pool, snapshot), f"pool {pool}: snapshot")
        except PipelineFailed as exc:
            log.error("%s", exc)  # only recovery time suffers; the next snapshot tries again
            return
        self.stats.snapshots += 1

    async def flush(self) -> None:
        """Wait for every publication handed out so far and every snapshot being saved."""
        for runtime in list(self.runtimes.values()):
            await asyncio.gather(*runtime.inflight, return_exceptions=True)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self._check()

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _job_state(state: ClusterState, event: SchedulerEvent, cause: str) -> list[JobStateRecord]:
    """The job-state record of ``event`` (call before evolving it: the job may leave the state)."""
    if not isinstance(event, ev.JOB_STATE_EVENTS):
        return []
    if isinstance(event, ev.JobAccepted):
        return [JobStateRecord(event, (event.job.job_queue, event.job.quota_share), cause)]
    job = state.jobs.get(event.job_id)
    return [JobStateRecord(event, None if job is None else job.share, cause)]


def _result(
    message: SchedulerInput, events: Sequence[SchedulerEvent], pool: str, now: int
) -> list[InputResult]:
    answer = result_of(message, events, pool, now)
    return [] if answer is None else [answer]


def _still_needed(state: ClusterState, command: NodeCommand) -> bool:
    """On recovery: a RunAttempt matters only while its attempt is current and not yet reported, a
    RegisterAgain only while its node is unknown or lost."""
    if isinstance(command, RegisterAgain):
        node = state.nodes.get(command.node_id)
        return node is None or not node.online
    if not isinstance(command, RunAttempt):
        return True
    job = state.jobs.get(command.job_id)
    return job is not None and job.attempt_id == command.attempt_id and job.status is JobStatus.SCHEDULED
