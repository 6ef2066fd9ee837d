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
3. ``decide`` on the pool's state (the loop's ``decide_one``, as the embedded shell), then ``append``
   the input, its events and the record's position in one store transaction. ``DuplicateInput``: the
   same input was recorded before (a re-produced or redelivered message): skip it. ``StaleWriter``:
   another worker wrote the pool: drop the state; if the partition is still ours, rebuild it from the
   store and decide the record again, otherwise stop (the partition moved; it is rebuilt when it is
   assigned here again). ``TransientStoreError``: the store is unreachable: retry the same append with
   back-off and decide nothing else meanwhile (the pool's lock is held); after
   ``store_retry_seconds`` say so and retry on, unready (``store_give_up``: fail instead). The records
   stay unacknowledged on Kafka until their append commits.
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

Batches: the records of one pool in a batch are handed to the pool's batch driver
(``scheduler.driver``, the same as the embedded shell's), with this mode's port
(``scheduler.pool_port``):
its live state is the pool's ``PoolRuntime``, rebuilt by loading the latest snapshot and the log after
it (``scheduler.recovery``); records below the pool's recorded position are skipped and an input twice
in a batch is a duplicate (``todo``); the rest are stepped one after another on the live state, a
snapshot due inside the batch dumped at its exact sequence (``stepped``), appended with their positions
by ONE ``append_many`` once the batch before has settled, and only then settled: outcomes, positions,
publications in decision order, and the snapshot, saved once they are acknowledged (``settle``); the
agent acks the records afterwards. A failed append drops the pool's state: ``DuplicateInput`` (an input
of the batch was recorded before: ``recorded_inputs`` names every such input, they are skipped) and
``StaleWriter`` reload the pool from the store and decide the rest of the batch again, as one batch
(``append_failed``); ``TransientStoreError`` retries the same batch (if a retry finds the batch
recorded, it had committed). Nothing is published for a batch that is not recorded. A lone input is
decided with its append awaited (``decide_one``: a duplicate costs no reload); an input whose step
raises (a bug in the core) fails the batch and the worker.

Ticks (``tick()``) are decided directly through the same path (decide, append, publish) for the pools
this worker holds, once a pool has been loaded for ``tick_grace_seconds``: a scheduler that was down
must first read the heartbeats queued meanwhile before it may declare nodes lost.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from gpuquota.adapters.event_store import EventStore, Position, StaleWriter
from gpuquota.scheduler.driver import BatchDriver
from gpuquota.scheduler.loop import (
    Appender,
    JobStateRecord,
    LoopFailed,
    OnAppend,
    RetryPolicy,
)
from gpuquota.scheduler.pacing import Snapshots
from gpuquota.scheduler.pool_port import PipelineFailed, PoolPort
from gpuquota.scheduler.pools import Item, Outcome, PipelineSettings, PoolRuntime, Stats
from gpuquota.scheduler.records import RecordPublisher, SourceRecord, decode, pool_of
from gpuquota.scheduler.recovery import load_pool
from gpuquota.support.clock import Clock, wall_clock_ms
from gpuquota.support.ids import uuid4
from gpuquota.wire import inputs as inp
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.input_results import result_of_undecodable

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

__all__ = [
    "JobStateRecord",
    "LogTruncated",
    "Outcome",
    "Pipeline",
    "PipelineFailed",
    "PipelineSettings",
    "SourceRecord",
    "decode",
]


_DEFAULTS = PipelineSettings()


class LogTruncated(LoopFailed):
    """A pool's log is shorter than this worker saw it committed: the database lost its end.

    The state, the recorded positions and what was published all ran ahead of the log, so this process
    cannot go on: it fails, and its restart recovers from the log that is left, reading the inputs the
    log lost from Kafka again (``scheduler.rewind``)."""


class Pipeline:
    """Per-pool states of one scheduler worker; see the module docstring."""

    def __init__(
        self,
        store: EventStore,
        publisher: RecordPublisher,
        settings: PipelineSettings = _DEFAULTS,
        *,
        clock: Clock = wall_clock_ms,
        owns: Callable[[str, int], bool] = lambda topic, partition: True,
        on_append: OnAppend | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.default_pool = settings.default_pool
        self.heartbeat_timeout_ms = timeout_ms = settings.heartbeat_timeout_ms
        grace = settings.tick_grace_seconds
        self.tick_grace_seconds = timeout_ms / 1000 if grace is None else grace
        self.retry = RetryPolicy(
            settings.store_retry_seconds,
            settings.retry_initial_seconds,
            settings.retry_max_seconds,
            give_up=settings.store_give_up,
            warn=log.warning,
            on_error=self._count_transient_error,
        )
        self.appender = Appender(store, self.retry, on_append)
        self.clock = clock
        self.owns = owns
        self.runtimes: dict[str, PoolRuntime] = {}
        self.stats = Stats()
        self.snapshots = Snapshots(
            store,
            self.retry,
            self.stats,
            every=settings.snapshot_every,
            cpu_share=settings.snapshot_cpu_share,
        )
        self._loading: dict[str, asyncio.Lock] = {}
        self._partitions: dict[str, TopicPartition] = {}
        self.drivers: dict[str, BatchDriver[Item, PoolRuntime]] = {}
        """One per pool seen, kept across reloads of its state (its batches in flight)."""
        self._failure: BaseException | None = None
        self._recorded: dict[str, int] = {}
        """The last sequence of each pool this worker saw committed (a reload must not find less)."""

    # ----- the agent's loop body ---------------------------------------------------------------

    async def handle(self, record: SourceRecord) -> Outcome:
        """Handle one record (a batch of one)."""
        (outcome,) = await self.handle_batch([record])
        return outcome

    async def handle_batch(self, records: Sequence[SourceRecord]) -> list[Outcome]:
        """Handle records consumed together, in order per pool; one outcome per record."""
        return await (await self.start_batch(records))

    async def start_batch(self, records: Sequence[SourceRecord]) -> asyncio.Future[list[Outcome]]:
        """Decide ``records`` now; the future settles (one outcome per record) once they are recorded
        and published. The next batch may be started meanwhile ("Two batches in flight")."""
        self._check()
        outcomes: list[Outcome] = [Outcome.DEAD_LETTER] * len(records)
        pools: dict[str, list[Item]] = {}
        for index, record in enumerate(records):
            decoded = decode(record, self.default_pool)
            if isinstance(decoded, str):
                await self._dead_letter(record, decoded)
                continue
            pool, message = decoded
            self._partitions[pool] = (record.topic, record.partition)
            position = Position(record.topic, record.partition, record.offset + 1)
            pools.setdefault(pool, []).append(Item(index, message, position))
        started = [(items, await self.driver(pool).start(items)) for pool, items in pools.items()]
        return asyncio.ensure_future(_gathered(outcomes, started))

    def driver(self, pool: str) -> BatchDriver[Item, PoolRuntime]:
        """The pool's batch driver (made on first use)."""
        driver = self.drivers.get(pool)
        if driver is None:
            driver = self.drivers[pool] = BatchDriver(PoolPort(self, pool), self.appender, pool)
        return driver

    async def tick(self) -> None:
        """Decide a ``Tick`` for every pool held here (and past its grace period) that is idle."""
        self._check()
        now = time.monotonic()
        for pool, runtime in list(self.runtimes.items()):
            if runtime.lock.locked() or self._in_flight(pool):
                continue  # busy: the tick can wait
            if now - runtime.loaded_at < self.tick_grace_seconds:
                continue
            async with runtime.lock:
                if runtime.dropped:
                    continue
                message = inp.Tick(event_id=f"tick/{pool}/{uuid4()}", occurred_at=self.clock())
                try:
                    await self.driver(pool).decide_now(runtime, [Item(-1, message, None)])
                except StaleWriter as exc:
                    self.stale(pool, exc)

    def _in_flight(self, pool: str) -> bool:
        driver = self.drivers.get(pool)
        return driver is not None and driver.busy

    def stale(self, pool: str, exc: StaleWriter) -> None:
        self.stats.stale += 1
        log.warning("pool %s: %s; dropping its state", pool, exc)
        self.drop(pool)

    # ----- partitions ----------------------------------------------------------------------------

    async def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """Load the pools recorded on newly assigned partitions (recovery; starts their ticks)."""
        for topic, partition in partitions:
            pools = await self.retry.call(
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
                runtime = await self.retry.call(lambda: self._load(pool), f"pool {pool}: load")
                self.runtimes[pool] = runtime
            return runtime

    async def _load(self, pool: str) -> PoolRuntime:
        runtime, deliveries, republished = await load_pool(
            self.store, self.publisher, pool, self.heartbeat_timeout_ms, self.clock
        )
        recorded = self._recorded.get(pool, 0)
        if runtime.seq < recorded:
            raise LogTruncated(
                f"pool {pool}: the event log ends at sequence {runtime.seq}, but this scheduler saw it"
                f" committed up to {recorded}: the log lost its end (a database crash without durable"
                " commits, a failover to an asynchronous replica, a restore); a restart reads the lost"
                " inputs from Kafka again and reconciles with what the nodes report"
            )
        runtime.inflight.extend(self.watch(deliveries))
        self.stats.republished += republished
        self.stats.loads += 1
        return runtime

    def recorded_to(self, pool: str, seq: int) -> None:
        """Note that ``pool``'s log was committed up to ``seq`` (a later load must not find less)."""
        self._recorded[pool] = max(seq, self._recorded.get(pool, 0))

    @property
    def store_available(self) -> bool:
        """False while an append or load is retrying a ``TransientStoreError``."""
        return self.retry.available

    def _count_transient_error(self) -> None:
        self.stats.transient_errors += 1

    # ----- publications and snapshots ----------------------------------------------------------

    def watch(self, deliveries: list[Awaitable[object]]) -> list[Awaitable[object]]:
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
        pool = pool_of(record.key, self.default_pool)
        answer = None if pool is None else result_of_undecodable(record.value, reason, pool, self.clock())
        if answer is not None:  # the producer waits for an answer to its event id
            await asyncio.gather(*await self.publisher.publish([], [], [answer]))

    async def flush(self) -> None:
        """Wait for every batch in flight, every publication handed out so far and every snapshot
        being saved."""
        for driver in list(self.drivers.values()):
            await driver.flush()
        for runtime in list(self.runtimes.values()):
            await asyncio.gather(*runtime.inflight, return_exceptions=True)
        await self.snapshots.flush()
        self._check()

    async def close(self) -> None:
        for driver in list(self.drivers.values()):
            await driver.close()
        await self.snapshots.close()


async def _gathered(
    outcomes: list[Outcome], started: Sequence[tuple[list[Item], Awaitable[None]]]
) -> list[Outcome]:
    """The outcome of each record, once every pool's batch has settled."""
    for items, settling in started:
        await settling
        for item in items:
            assert item.outcome is not None, item
            outcomes[item.index] = item.outcome
    return outcomes
