"""Fixtures for the distributed-mode tests: unique topics, group ids and pools per test, a topic reader,
a TCP proxy in front of PostgreSQL (to make the database unreachable without touching it), and
polling helpers with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from gpuquota.adapters.kafka import KafkaTopics, encode, ensure_topics, message_headers
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.scheduler.faust_app import SchedulerConfig
from gpuquota.wire.base import Message
from gpuquota.wire.inputs import SchedulerInput
from tests.pipeline.services import Services

PARTITIONS = 2


def unique(messages: Sequence[SchedulerInput], run_id: str) -> list[SchedulerInput]:
    """The messages with event ids unique to this run (input ids are unique across the database)."""
    return [m.model_copy(update={"event_id": f"{run_id}/{m.event_id}"}) for m in messages]


async def wait_until(
    condition: Callable[[], Awaitable[bool] | bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)  # polling interval


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def pool(run_id: str) -> str:
    return f"p-{run_id}"


@pytest_asyncio.fixture
async def topics(kafka_bootstrap: str, run_id: str) -> KafkaTopics:
    names = KafkaTopics(f"it-{run_id}.")
    await ensure_topics(kafka_bootstrap, names, partitions=PARTITIONS)
    return names


@pytest_asyncio.fixture
async def services(
    kafka_bootstrap: str, database_url: str, topics: KafkaTopics, pool: str, tmp_path: Path
) -> AsyncIterator[Services]:
    """Build the test's service processes; they are killed (and their logs printed) at the end."""
    made = Services(kafka_bootstrap, database_url, topics.prefix, pool, tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest_asyncio.fixture
async def store(database_url: str) -> AsyncIterator[PostgresEventStore]:
    """A direct connection to the shared test database (pools are unique per test)."""
    opened = await PostgresEventStore.connect(database_url)
    try:
        yield opened
    finally:
        await opened.close()


def scheduler_config(
    kafka: str, database_url: str, topics: KafkaTopics, pool: str, tmp_path: Path, **overrides: Any
) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "kafka": kafka,
        "database_url": database_url,
        "topics": topics,
        "default_pool": pool,
        "data_dir": tmp_path / "scheduler",
        "commit_interval": 0.2,
        "tick_grace_seconds": 3600.0,  # no ticks unless a test wants them
        "partitions": PARTITIONS,
    }
    fields.update(overrides)
    return SchedulerConfig(**fields)


class Producer:
    """Produces raw records (or messages) to the inputs topic, keyed by pool."""

    def __init__(self, bootstrap: str, topics: KafkaTopics, pool: str) -> None:
        self.topic = topics.inputs
        self.pool = pool
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)

    async def send(self, message: Message | bytes, key: bytes | None = None) -> int:
        if isinstance(message, bytes):
            value, headers = message, []
        else:
            value, headers = encode(message), message_headers(message)
        meta = await self._producer.send_and_wait(
            self.topic, value, key=key if key is not None else self.pool.encode(), headers=headers
        )
        return int(meta.offset)


@pytest_asyncio.fixture
async def producer(kafka_bootstrap: str, topics: KafkaTopics, pool: str) -> AsyncIterator[Producer]:
    made = Producer(kafka_bootstrap, topics, pool)
    await made._producer.start()
    try:
        yield made
    finally:
        await made._producer.stop()


class TopicReader:
    """Reads every partition of a topic from the beginning and keeps the records."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.records: list[ConsumerRecord[bytes, bytes]] = []
        # no group: the consumer is assigned every partition and reads from the beginning
        self._consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def poll(self) -> list[ConsumerRecord[bytes, bytes]]:
        batch = await self._consumer.getmany(timeout_ms=100)
        for records in batch.values():
            self.records.extend(records)
        return self.records

    async def until(
        self, condition: Callable[[list[ConsumerRecord[bytes, bytes]]], bool], timeout: float, what: str
    ) -> list[ConsumerRecord[bytes, bytes]]:
        async def check() -> bool:
            return condition(await self.poll())

        await wait_until(check, timeout, what, interval=0)
        return self.records

    async def stop(self) -> None:
        await self._consumer.stop()


@pytest_asyncio.fixture
async def reader(kafka_bootstrap: str) -> AsyncIterator[Callable[[str], Awaitable[TopicReader]]]:
    made: list[TopicReader] = []

    async def open_reader(topic: str) -> TopicReader:
        tail = TopicReader(kafka_bootstrap, topic)
        await tail.start()
        made.append(tail)
        return tail

    try:
        yield open_reader
    finally:
        for tail in made:
            await tail.stop()


class TcpProxy:
    """Forwards a local port to ``target``; ``stop()`` closes the listener and every connection."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()
        self._writers.discard(writer)


@pytest_asyncio.fixture
async def pg_proxy(database_url: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A proxy to the test database and the database URL through it."""
    url = urlsplit(database_url)
    assert url.hostname is not None and url.port is not None
    proxy = TcpProxy(url.hostname, url.port)
    await proxy.start()
    netloc = url.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
    try:
        yield proxy, urlunsplit(url._replace(netloc=netloc))
    finally:
        await proxy.stop()
