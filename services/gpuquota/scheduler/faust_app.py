"""``gpuquota scheduler``: a faust-streaming app with one agent around ``Pipeline`` (distributed mode).

Theory of operation
-------------------
The app (id ``<prefix>gpuquota-scheduler``, which is also the consumer group) has ONE agent with
``concurrency=1`` on ``gpuquota.scheduler.inputs`` (raw keys and values; pydantic decodes). It takes
the records getmany-style (``faust_transport.Inbox``: the consumer hands each fetched partition's
records over in one piece, not one faust event per record) in batches (``Inbox.batches``: all that
arrived while the previous batch was handled, up to ``batch_max``, never waiting for more), and its
loop body is ``Pipeline.start_batch(records)``: decode or dead-letter, decide each pool's records in
order, append them with their positions in one transaction, publish. Within a partition records are
handled strictly in order. Two batches are in flight at most (``_BATCHES_IN_FLIGHT``): the next batch
is decided while the one before is being appended (``scheduler.driver``). The agent acks a batch's
records once that batch is recorded and published (``Inbox.ack``, from the batch's future), and
faust commits acked offsets every ``commit_interval``; those committed offsets are only advisory: the
store's recorded positions decide what was already applied (see ``pipeline``), and where the log is
behind them (it lost its end) the assignment commits them back to the log's positions first
(``scheduler.rewind``), so the inputs it lost are read again. A batch that fails fails the service.

A faust timer runs ``Pipeline.tick()`` every ``tick_seconds`` (ticks are decided directly, not sent
through the topic). On partition assignment (faust passes the whole new assignment) the pools of the
newly held partitions are loaded in the background (snapshot + log tail, republishing the tail) and
pools of partitions no longer held are dropped; revocation alone changes nothing, since an eager
rebalance revokes everything before assigning most of it back.

Publications go through the app's producer (``acks=all``); a delivery that fails, a log found shorter
than what this process decided (``LogTruncated``), or a bug fails the service: ``wait()`` returns the
error and ``gpuquota scheduler`` exits 1, to be restarted by its supervisor (recovery is the normal
start). An unreachable store is retried with back-off, deciding nothing meanwhile; past
``store_retry_seconds`` the service is unready and retries on (``RetryPolicy.give_up``).

faust runs inside the caller's event loop (``await app.start()``), so ``gpuquota up`` can hold the
scheduler, the gateway and node agents in one process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import faust
from faust.types import TP
from faust.types.auth import CredentialsT

from gpuquota.adapters.event_store import EventStore, TransientStoreError
from gpuquota.adapters.kafka import (
    Headers,
    KafkaTopics,
    bootstrap_list,
    encode,
    ensure_topics,
    message_headers,
    ssl_context,
)
from gpuquota.adapters.partitioner import default_partition
from gpuquota.config.kafka import PLAINTEXT, KafkaSecurity
from gpuquota.core.policy import DEFAULT_POLICY
from gpuquota.observe.metrics import Timings
from gpuquota.scheduler.faust_transport import Inbox, SchedulerApp
from gpuquota.scheduler.loop import JobStateRecord, LoopFailed, RetryPolicy
from gpuquota.scheduler.pipeline import Outcome, Pipeline, PipelineFailed, PipelineSettings
from gpuquota.scheduler.records import SourceRecord
from gpuquota.scheduler.rewind import rewind_assigned
from gpuquota.wire import events as ev
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.node_commands import NodeCommand

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig(PipelineSettings):
    """The scheduler service: its pipeline's settings and its Kafka consumer's."""

    kafka: str
    database_url: str
    topics: KafkaTopics = field(default_factory=KafkaTopics)
    kafka_security: KafkaSecurity = PLAINTEXT
    """TLS and SASL of every Kafka client of the service (faust's through ``faust_credentials``)."""
    tick_seconds: float = DEFAULT_POLICY.tick_seconds
    commit_interval: float = 1.0
    data_dir: Path = Path(".gpuquota")
    partitions: int | None = None
    """Partitions of topics this service creates (default: the catalogue's)."""
    app_id: str | None = None
    """The faust app id and consumer group (default ``topics.scheduler_group``)."""
    instance_id: str | None = None
    """Static group membership (KIP-345): a restarted scheduler with the same id gets its partitions
    back at once, without waiting for the group to notice that the old process is gone."""
    session_timeout: float = 10.0
    """Seconds without a heartbeat before the group gives a (crashed) member's partitions to others."""
    batch_max: int = 500
    """Most records handled (and appended per pool in one transaction) together."""
    batch_linger: float = 0.005
    """Seconds a batch may wait for more records after the previous one (see ``batches``)."""
    fetch_max_wait: float = 0.02
    """Seconds the broker may hold a fetch of the inputs waiting for data (faust's own: 1.5 s)."""
    fetch_min_bytes: int = 64 * 1024
    """Bytes a fetch waits for (at most ``fetch_max_wait``; faust's own: 1): under load, few large
    fetches instead of one per few records (each costs the consumer thread, a request and a hand-over
    to the loop: a quarter of the scheduler's CPU at 1,000 jobs/s with 1 byte)."""


_WAITING_BATCHES = 8
"""Batches of records that may wait for the agent before the consumer stops fetching."""
_BATCHES_IN_FLIGHT = 2
"""Batches handed to the pipeline and not yet settled: the next is decided while one is appended."""
_PUBLISH_BATCH_BYTES = 512 * 1024
"""Most bytes in one produced batch (aiokafka's default: 16 KiB; the broker takes up to 1 MiB)."""


def job_id_of(event: ev.SchedulerEvent) -> str:
    if isinstance(event, ev.JobAccepted):
        return event.job.job_id
    job_id: str = getattr(event, "job_id", "")
    return job_id


class FaustPublisher:
    """``Publisher`` through the faust app's producer: one record batch per partition and call.

    Handing records over one ``send`` at a time cost about 15 % of the scheduler's CPU at 1,000 jobs/s
    (each send waits on metadata, picks its partition with a pure-Python murmur2 and returns a future
    to watch). Instead a call's records are appended, in order, to one aiokafka ``BatchBuilder`` per
    partition (another when one is full) and each is handed over with ``send_batch``: one delivery
    future per batch. The partition is the default partitioner's (murmur2 of the key, cached per key),
    so each key's records land where ``send`` would have put them, in the same order
    (``adapters.partitioner``: aiokafka's own murmur2, cached per key).
    """

    def __init__(self, app: faust.App, topics: KafkaTopics) -> None:
        self.app = app
        self.topics = topics

    async def publish(
        self,
        records: Sequence[JobStateRecord],
        commands: Sequence[NodeCommand],
        results: Sequence[InputResult] = (),
    ) -> list[Awaitable[object]]:
        producer = cast(Any, self.app.producer)._ensure_producer()
        wanted = (
            (self.topics.node_commands, commands),
            (self.topics.job_state, records),
            (self.topics.input_results, results),
        )
        counts = {topic: len(await producer.partitions_for(topic)) for topic, items in wanted if items}
        batches: dict[tuple[str, int], list[Any]] = {}

        def add(topic: str, key: bytes, value: bytes, headers: Headers) -> None:
            builders = batches.setdefault((topic, default_partition(key, counts[topic])), [])
            record = {"timestamp": None, "key": key, "value": value, "headers": headers}
            if builders and builders[-1].append(**record) is not None:
                return
            builders.append(producer.create_batch())  # the first, or the last is full
            if builders[-1].append(**record) is None:
                raise ValueError(f"a record of {len(value)} bytes does not fit in a batch")

        for command in commands:
            value = encode(command)
            add(self.topics.node_commands, command.node_id.encode(), value, message_headers(command))
        for record in records:
            headers = message_headers(record.event)
            if record.share is not None:
                queue, share = record.share
                headers += [("job_queue", queue.encode()), ("quota_share", share.encode())]
            if record.cause is not None:
                headers.append(("input_event_id", record.cause.encode()))
            add(self.topics.job_state, job_id_of(record.event).encode(), encode(record.event), headers)
        for result in results:
            headers = [*message_headers(result), ("input_event_id", result.input_event_id.encode())]
            add(self.topics.input_results, result.pool.encode(), encode(result), headers)
        deliveries: list[Awaitable[object]] = []
        for (topic, partition), builders in batches.items():
            for builder in builders:
                deliveries.append(await producer.send_batch(builder, topic, partition=partition))
        return deliveries

    async def dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        value, headers = encode(letter), message_headers(letter)
        delivery = await self.app.producer.send(self.topics.dead_letter, key, value, None, None, headers)
        await delivery


def faust_credentials(security: KafkaSecurity) -> CredentialsT | None:
    """faust's ``broker_credentials`` for ``security`` (None: plaintext): ``client_options`` for faust."""
    context = ssl_context(security) if security.tls else None
    if security.sasl:
        assert security.password is not None, "the settings require a password with SASL"
        return faust.SASLCredentials(  # SASL_SSL when given a context
            username=security.username,
            password=security.password.get_secret_value(),
            mechanism=security.sasl_mechanism,
            ssl_context=context,
        )
    return None if context is None else faust.SSLCredentials(context)


async def connect_store(url: str, retry_seconds: float) -> EventStore:
    """A ``PostgresEventStore``, retrying while the database is unreachable (the loop's
    ``RetryPolicy``, bounded: at start-up a database that never answers is a configuration error,
    raised as its last ``TransientStoreError``)."""
    from gpuquota.adapters.postgres_store import PostgresEventStore

    policy = RetryPolicy(retry_seconds, initial=0.1, warn=log.warning)
    try:
        return await policy.call(lambda: PostgresEventStore.connect(url), "database")
    except LoopFailed as exc:
        if isinstance(exc.__cause__, TransientStoreError):
            raise exc.__cause__ from None
        raise


class SchedulerService:
    """Start with ``await service.start()``; ``await service.wait()`` returns when it stops or fails."""

    def __init__(self, config: SchedulerConfig, store: EventStore | None = None) -> None:
        self.config = config
        self.topics = config.topics
        self.store = store
        self._own_store = store is None
        self.app: faust.App | None = None
        self.pipeline: Pipeline | None = None
        self.failure: BaseException | None = None
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[bool]] = set()
        self.timings = Timings()
        """Step and append histograms (``gpuquota.observe``; per batch, never per input)."""
        self.rewound = 0
        """Inputs read again because Kafka's committed offsets were past the log's (``scheduler.rewind``)."""

    async def start(self) -> None:
        cfg = self.config
        await ensure_topics(cfg.kafka, self.topics, cfg.partitions, security=cfg.kafka_security)
        if self.store is None:
            self.store = await connect_store(cfg.database_url, cfg.store_retry_seconds)
        (cfg.data_dir / "faust").mkdir(parents=True, exist_ok=True)
        self.app = app = self._build_app()
        publisher = FaustPublisher(app, self.topics)
        self.pipeline = Pipeline(self.store, publisher, cfg, owns=self._owns, on_append=self.timings.appended)
        await app.start()
        log.info("scheduler started (group %s, topic %s)", self.topics.scheduler_group, self.topics.inputs)

    def _build_app(self) -> faust.App:
        cfg = self.config
        app = SchedulerApp(
            cfg.app_id or self.topics.scheduler_group,
            broker=[f"kafka://{server}" for server in bootstrap_list(cfg.kafka)],
            broker_credentials=faust_credentials(cfg.kafka_security),
            store="memory://",
            datadir=str(cfg.data_dir / "faust"),
            web_enabled=False,
            topic_disable_leader=True,
            topic_replication_factor=1,
            consumer_auto_offset_reset="earliest",
            broker_commit_interval=cfg.commit_interval,
            consumer_group_instance_id=cfg.instance_id,
            broker_session_timeout=cfg.session_timeout,
            broker_heartbeat_interval=min(3.0, cfg.session_timeout / 4),
            producer_acks=-1,
            producer_linger=0.002,  # batch the publications of consecutive inputs
            # a batch per partition and publish call (FaustPublisher): a second batch of a partition
            # waits until the first is drained to the sender
            producer_max_batch_size=_PUBLISH_BATCH_BYTES,
            loop=asyncio.get_running_loop(),
        )
        app.fetch_max_wait_ms = max(1, round(cfg.fetch_max_wait * 1000))
        app.fetch_min_bytes = max(1, cfg.fetch_min_bytes)
        raw: faust.Schema[bytes, bytes] = faust.Schema(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
        inputs = app.topic(self.topics.inputs, schema=raw)

        @app.agent(inputs, concurrency=1, name=f"{self.topics.prefix}scheduler")
        async def scheduler(stream: faust.StreamT[bytes]) -> None:
            inbox = app.inbox(stream, most_waiting=_WAITING_BATCHES * max(1, cfg.batch_max))
            flight: deque[asyncio.Future[list[Outcome]]] = deque()
            async for records in inbox.batches(max(1, cfg.batch_max), cfg.batch_linger):
                while flight and (flight[0].done() or len(flight) >= _BATCHES_IN_FLIGHT):
                    await asyncio.wait([flight.popleft()])
                if self.failure is not None or not await self._guard(self._start(inbox, records, flight)):
                    return

        async def ticker() -> None:
            await self._guard(self._pipeline().tick())

        app.timer(cfg.tick_seconds)(ticker)

        async def on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
            assigned: set[TP] = args[0] if args else kwargs["assigned"]
            held = {(tp.topic, tp.partition) for tp in assigned if tp.topic == self.topics.inputs}
            self._pipeline().retain(held)
            assert self.store is not None and self.app is not None
            self.rewound += await rewind_assigned(
                self.app.consumer, self.store, sorted(held), cfg.session_timeout / 2
            )
            self._spawn(self._pipeline().assigned(sorted(held)))

        app.on_partitions_assigned.connect(cast(Any, on_assigned))
        app.finalize()
        return app

    async def _start(
        self, inbox: Inbox, records: list[SourceRecord], flight: deque[asyncio.Future[list[Outcome]]]
    ) -> None:
        """Hand ``records`` to the pipeline; ack them once they are recorded and published."""
        started = time.perf_counter()
        settling = await self._pipeline().start_batch(records)
        settling.add_done_callback(functools.partial(self._settled, inbox, records, started))
        flight.append(settling)

    def _settled(
        self, inbox: Inbox, records: list[SourceRecord], started: float, settling: asyncio.Future[object]
    ) -> None:
        if settling.cancelled():
            return
        if (exc := settling.exception()) is not None:
            self._fail(exc)
            return
        self.timings.step.observe(time.perf_counter() - started)
        inbox.ack(records)

    def _pipeline(self) -> Pipeline:
        assert self.pipeline is not None, "start() first"
        return self.pipeline

    def _owns(self, topic: str, partition: int) -> bool:
        assert self.app is not None
        return TP(topic, partition) in self.app.consumer.assignment()

    async def _guard(self, work: Coroutine[Any, Any, object]) -> bool:
        """Run ``work``; on an error, fail the service (False)."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(self._guard(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            level = logging.ERROR if isinstance(exc, PipelineFailed) else logging.CRITICAL
            log.log(level, "scheduler failed: %r", exc, exc_info=exc)
            self.failure = exc
        self._done.set()

    async def wait(self) -> BaseException | None:
        """Wait until the service fails (return the error) or ``stop()`` is called (return None)."""
        await self._done.wait()
        return self.failure

    async def stop(self) -> None:
        self._done.set()
        for task in list(self._tasks):
            task.cancel()
        if self.app is not None:
            await self.app.stop()
        if self.pipeline is not None:
            await self.pipeline.close()
        if self.store is not None and self._own_store:
            await self.store.close()
            self.store = None
