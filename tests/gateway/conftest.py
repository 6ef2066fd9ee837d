"""The gateway contract suite's stacks, driven through unmodified boto3, in both modes.

Every test that takes the ``stack`` (or ``batch``) fixture runs twice, once per ``mode``:

* ``embedded``: an ``EmbeddedStack`` (in-memory log) in a background thread with its own event loop,
  a fresh one per test. ``feed`` hands inputs to the shell directly.
* ``distributed`` (marker ``integration``: a real Kafka broker and PostgreSQL server): ONE faust
  ``SchedulerService`` per session, on topics with a prefix of its own, and per test a fresh
  ``GatewayService`` (Kafka command port + PostgreSQL log projector) on a pool of its own, so each
  test starts from an empty pool exactly as in embedded mode. ``feed`` produces the input to the
  inputs topic keyed by the pool, as a node agent's ``KafkaNodeLink`` does, and returns once the
  gateway's projector has folded the scheduler's decision from the log.

Tests play the node agent themselves: ``stack.register_node`` and ``stack.report`` feed inputs (no
local agents, no ticks, so nothing happens behind a test's back), and return once they are decided
and visible to the gateway. ``make_stack(auth=..., durable=...)`` starts more stacks of the test's
mode and ``stack.reopen()`` restarts one over the same log. ``@distributed_only(reason)`` marks a
test of a documented difference of the distributed mode; tests that build a ``StackThread``
themselves (test_embedded.py) are embedded-only.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest

from gpuquota.core import ClusterState
from gpuquota.entrypoints.embedded import EmbeddedStack
from gpuquota.gateway import Gateway
from gpuquota.gateway.auth import Keyring
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer

T = TypeVar("T")
G5 = "ml.g5.xlarge"
DECIDED_WITHIN = 20.0
"""Seconds a distributed-mode test waits for a decision (a loaded 2-core CI machine is slow)."""

MODES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("distributed", id="distributed", marks=pytest.mark.integration),
]


def distributed_only(reason: str) -> pytest.MarkDecorator:
    """Run a ``stack`` test in distributed mode only; ``reason`` says why (kept for the reader)."""
    assert reason
    distributed = pytest.param("distributed", id="distributed", marks=pytest.mark.integration)
    return pytest.mark.parametrize("mode", [distributed], indirect=True)


class LoopThread:
    """An event loop in a daemon thread; ``run`` waits for a coroutine scheduled on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def batch_client(url: str) -> Any:
    return boto3.client(
        "batch", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )


class _Helpers:
    """What the tests use of a stack, in either mode (``feed`` and ``state`` are the mode's)."""

    mode: str
    pool: str
    client: Any
    closed = False

    def reopen(self) -> Stack:
        """Close this stack and start a new one over the same log (a restart)."""
        raise NotImplementedError

    def feed(self, kind: type[Any], **fields: Any) -> list[Any]:
        raise NotImplementedError

    @property
    def state(self) -> ClusterState:
        raise NotImplementedError

    @property
    def gateway(self) -> Gateway:
        raise NotImplementedError

    def register_node(self, node_id: str = "node-1", unit: str = G5, count: int = 3) -> None:
        slots = tuple(SlotOffer(unit=unit, gpus=(i,)) for i in range(count))
        self.feed(inp.RegisterNode, node_id=node_id, pool=self.pool, slots=slots)

    def tick_later(self, seconds: float) -> None:
        """A clock tick ``seconds`` from now (time limits), decided like any other input; every
        online node heartbeats just before it, so that no node is lost on the way."""
        at = time.time_ns() // 1_000_000 + int(seconds * 1000)
        for node_id in sorted(n.node_id for n in self.state.nodes.values() if n.online):
            self.feed(inp.NodeHeartbeat, node_id=node_id, occurred_at=at)
        self.feed(inp.Tick, occurred_at=at)

    def report(self, job_id: str, status: str, **fields: Any) -> None:
        record = self.state.jobs[job_id]
        assert record.attempt_id is not None, f"{job_id} has no attempt"
        for node_id in sorted({p.node_id for p in record.placements}):
            self.feed(
                inp.AttemptReport,
                node_id=node_id,
                job_id=job_id,
                attempt_id=record.attempt_id,
                status=status,
                **fields,
            )


class StackThread(LoopThread, _Helpers):
    """An ``EmbeddedStack`` in its own loop thread (``options``: ``EmbeddedStack``'s)."""

    mode = "embedded"
    pool = "default"

    def __init__(self, **options: Any) -> None:
        super().__init__("embedded-stack")
        options = {
            "data_dir": None,
            "port": 0,
            "nodes": "",
            "runtime": "simulated",
            "tick_seconds": 0,
            **options,
        }
        self.options = options
        self.stack = EmbeddedStack(**options)
        self.run(self.stack.start())
        self.client = batch_client(self.stack.url)

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def shell(self) -> SchedulerShell:
        assert self.stack.shell is not None
        return self.stack.shell

    @property
    def state(self) -> ClusterState:
        return self.shell.state

    @property
    def gateway(self) -> Gateway:
        assert self.stack.gateway is not None
        return self.stack.gateway

    def feed(self, kind: type[Any], **fields: Any) -> list[Any]:
        at = fields.pop("occurred_at", None)  # a test's own clock (time limits), else the shell's
        message = self.shell.make(kind, **fields)
        if at is not None:
            message = message.model_copy(update={"occurred_at": at})

        async def go() -> list[Any]:
            return await self.shell.handle(message)

        return self.run(go())

    def reopen(self) -> StackThread:
        assert self.options["data_dir"] is not None, "an in-memory log does not survive a restart"
        self.close()
        return StackThread(**self.options)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.run(self.stack.stop())
        self.client.close()
        self.close_loop()


class DistributedBackend(LoopThread):
    """The session's faust scheduler, store connection and input producer, in one loop thread."""

    def __init__(self, kafka: str, database_url: str, data_dir: Path) -> None:
        from gpuquota.adapters.kafka import InputProducer, KafkaTopics
        from gpuquota.adapters.postgres_store import PostgresEventStore
        from gpuquota.scheduler.faust_app import SchedulerConfig, SchedulerService

        super().__init__("distributed-stack")
        self.kafka = kafka
        self.database_url = database_url
        self.topics = KafkaTopics(f"gw-{uuid.uuid4().hex[:10]}.")
        config = SchedulerConfig(
            kafka=kafka,
            database_url=database_url,
            topics=self.topics,
            default_pool="gw-default",
            data_dir=data_dir,
            commit_interval=0.2,
            tick_grace_seconds=3600.0,  # no ticks: nothing happens behind a test's back
            partitions=2,
        )
        self.scheduler: SchedulerService | None = None
        self.store: PostgresEventStore | None = None
        self.producer: InputProducer | None = None

        async def start() -> None:  # aiokafka and faust objects are made in the loop they run in
            self.scheduler = SchedulerService(config)
            await self.scheduler.start()
            self.store = await PostgresEventStore.connect(database_url)
            self.producer = InputProducer(kafka, self.topics, client_id="gpuquota-test-nodes")
            await self.producer.start()
            await self._until_deciding()

        try:
            self.run(start(), timeout=180)
        except BaseException:
            self.close()
            raise

    async def _until_deciding(self) -> None:
        """Wait until the scheduler has joined its group and decides (a probe pool's first input)."""
        assert self.scheduler is not None and self.store is not None and self.producer is not None
        pool = f"probe-{uuid.uuid4().hex[:10]}"
        probe = inp.RegisterNode(
            event_id=str(uuid.uuid4()), occurred_at=time.time_ns() // 1_000_000, node_id="probe", slots=()
        )
        await self.producer.send(pool, probe)
        deadline = time.monotonic() + 100
        while not await self.store.read(pool):
            if self.scheduler.failure is not None:
                raise self.scheduler.failure
            assert time.monotonic() < deadline, "the scheduler decided nothing within 100 s"
            await asyncio.sleep(0.05)  # polling interval

    def close(self) -> None:
        async def stop() -> None:
            if self.producer is not None:
                await self.producer.stop()
            if self.store is not None:
                await self.store.close()
            if self.scheduler is not None:
                await self.scheduler.stop()

        try:
            self.run(stop())
        finally:
            self.close_loop()


class DistributedStackThread(_Helpers):
    """A ``GatewayService`` on a fresh pool of the session's distributed backend (``auth``: its keys)."""

    mode = "distributed"

    def __init__(
        self,
        backend: DistributedBackend,
        auth: Keyring | None = None,
        pool: str | None = None,
        decision_timeout: float = DECIDED_WITHIN,
    ) -> None:
        from gpuquota.entrypoints.distributed import GatewayService

        self.backend = backend
        self.auth = auth
        self.pool = pool or f"gw-{uuid.uuid4().hex[:12]}"
        self.stack = GatewayService(
            backend.kafka,
            backend.database_url,
            topics=backend.topics,
            pool=self.pool,
            port=0,
            store=backend.store,
            auth=auth,
            decision_timeout=decision_timeout,
        )
        backend.run(self.stack.start())
        self.client = batch_client(self.stack.url)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return self.backend.run(coro, timeout)

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def state(self) -> ClusterState:
        """The core's state as the gateway folded it from the pool's log."""
        assert self.stack.projector is not None
        return self.stack.projector.state

    @property
    def gateway(self) -> Gateway:
        assert self.stack.gateway is not None
        return self.stack.gateway

    def feed(self, kind: type[Any], **fields: Any) -> list[Any]:
        """Produce the input to the inputs topic (keyed by the pool, as ``KafkaNodeLink.send`` does)
        and wait until the gateway has folded its decision; its events."""
        fields.setdefault("occurred_at", time.time_ns() // 1_000_000)
        message = kind(event_id=str(uuid.uuid4()), **fields)
        projector = self.stack.projector
        producer = self.backend.producer
        assert projector is not None and producer is not None

        async def go() -> list[Any]:
            decided = projector.expect(message.event_id)
            try:
                await producer.send(self.pool, message)
                return list(await asyncio.wait_for(asyncio.shield(decided), DECIDED_WITHIN))
            finally:
                projector.forget(message.event_id)

        return self.run(go())

    def reopen(self) -> DistributedStackThread:
        """A new gateway on the same pool: it folds the pool's log from PostgreSQL (the scheduler,
        whose own restarts tests/pipeline covers, keeps running)."""
        self.close()
        return DistributedStackThread(self.backend, self.auth, pool=self.pool)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.run(self.stack.stop())
        finally:
            self.client.close()


Stack = StackThread | DistributedStackThread


@pytest.fixture(scope="session")
def distributed_backend(
    kafka_bootstrap: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DistributedBackend]:
    backend = DistributedBackend(kafka_bootstrap, database_url, tmp_path_factory.mktemp("scheduler"))
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="session", params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start_stack(
    mode: str, request: pytest.FixtureRequest, auth: Keyring | None = None, data_dir: Path | None = None
) -> Stack:
    """A stack of ``mode`` for a fixture of any scope (the caller closes it). ``data_dir``: the
    embedded stack's SQLite log (to ``reopen`` it); the distributed log is always durable."""
    if mode == "embedded":
        return StackThread(auth=auth, data_dir=data_dir)
    return DistributedStackThread(request.getfixturevalue("distributed_backend"), auth=auth)


@pytest.fixture
def make_stack(mode: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., Stack]]:
    """Start a stack of the test's mode (``auth=``: a ``Keyring``; ``durable=True``: one that can be
    ``reopen``-ed); each one is closed after the test."""
    made: list[Stack] = []

    def make(auth: Keyring | None = None, durable: bool = False) -> Stack:
        data_dir = request.getfixturevalue("tmp_path") / f"log-{len(made)}" if durable else None
        stack = start_stack(mode, request, auth, data_dir)
        made.append(stack)
        return stack

    try:
        yield make
    finally:
        for stack in made:
            stack.close()


@pytest.fixture
def stack(make_stack: Callable[..., Stack]) -> Stack:
    return make_stack()


@pytest.fixture
def batch(stack: Stack) -> Any:
    return stack.client


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy (or fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
