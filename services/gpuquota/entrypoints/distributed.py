"""The distributed mode's services: gateway, scheduler and node agents over Kafka and PostgreSQL.

* ``GatewayService``: the AWS Batch HTTP gateway; writes are produced to the inputs topic, the read
  model tails the pool's log in PostgreSQL (see ``gateway.kafka_port``).
* ``SchedulerService`` (``scheduler.faust_app``): the faust app that decides.
* ``NodeAgentService``: one node agent whose ``send`` and commands go through ``KafkaNodeLink``.
* ``DistributedStack``: all three in one process (``gpuquota up --kafka ... --database-url ...``).

``gpuquota gateway``, ``gpuquota scheduler`` and ``gpuquota node-agent`` run one service each,
configured by ``GPUQUOTA_*`` variables (``gpuquota.config.settings``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.kafka import InputProducer, KafkaTopics, ensure_topics
from gpuquota.config.settings import PLAINTEXT, GatewaySettings, KafkaSecurity, SchedulerSettings
from gpuquota.core.policy import DEFAULT_POLICY, SchedulingPolicy
from gpuquota.entrypoints.gateway_front import GatewayFront
from gpuquota.entrypoints.local_s3 import S3Client
from gpuquota.entrypoints.metrics_port import scheduler_ops
from gpuquota.gateway import Gateway
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.auth import Keyring
from gpuquota.gateway.browser_guard import BrowserPolicy
from gpuquota.gateway.kafka_port import KafkaCommandPort, cancel
from gpuquota.gateway.log_tail import LogProjector
from gpuquota.gateway.node_routes import HttpLogs, LocalLogs, LogReader, NodeRoutes
from gpuquota.gateway.ops import gateway_registry, install
from gpuquota.node_agent import NodeAgent, Runtime
from gpuquota.node_agent.kafka_link import KafkaNodeLink
from gpuquota.node_agent.logs import LogServer
from gpuquota.node_agent.s3_stage import DataPlane
from gpuquota.observe.health import Probe, broker_probe, lag_probe, store_probe
from gpuquota.observe.startup import drain, run_service, wait_for_dependencies, warn_unknown_variables
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import Projector
from gpuquota.scheduler.faust_app import SchedulerConfig, SchedulerService, connect_store
from gpuquota.scheduler.loop import GC_THRESHOLDS
from gpuquota.support.arns import ArnFactory
from gpuquota.support.clock import wall_clock_ms
from gpuquota.support.dirlock import DirectoryLock
from gpuquota.wire.base import SlotOffer

log = logging.getLogger(__name__)


class GatewayService:
    """The HTTP gateway of one pool in distributed mode; ``url`` and ``gateway`` once started."""

    def __init__(
        self,
        kafka: str,
        database_url: str,
        *,
        topics: KafkaTopics | None = None,
        pool: str = "default",
        host: str = "127.0.0.1",
        port: int = 8080,
        arns: ArnFactory | None = None,
        decision_timeout: float = 5.0,
        produce_timeout: float = 5.0,
        admission: Admission | None = None,
        store: EventStore | None = None,
        auth: Keyring | None = None,
        node_logs: LogReader | None = None,
        browser: BrowserPolicy | None = None,
        kafka_security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.kafka = kafka
        self.kafka_security = kafka_security
        self.browser = browser
        self.database_url = database_url
        self.node_logs = node_logs
        """How ``gpuquota jobs logs`` reads a node's log: ``HttpLogs`` (``GPUQUOTA_NODE_LOGS_URL``)."""
        self.topics = topics or KafkaTopics()
        self.pool = pool
        self.host = host
        self.port = port
        self.read_model = ReadModel(arns)
        self.decision_timeout = decision_timeout
        self.produce_timeout = produce_timeout
        """Seconds the broker has to acknowledge an input before the request is a 503."""
        self.admission = admission or Admission()
        self.store = store
        self.auth = auth
        self._own_store = store is None
        self.projector: LogProjector | None = None
        self.producer: InputProducer | None = None
        self.gateway: Gateway | None = None
        self._front: GatewayFront | None = None
        self._tail: asyncio.Task[None] | None = None
        self.registry: CollectorRegistry | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await ensure_topics(self.kafka, self.topics, security=self.kafka_security)
        if self.store is None:
            self.store = await connect_store(self.database_url, retry_seconds=60.0)
        projector = self.projector = LogProjector(self.store, Projector(self.read_model), self.pool)
        folded = await projector.catch_up()
        log.info("gateway: read model folded %d log records of pool %s", folded, self.pool)
        self._tail = asyncio.create_task(projector.run(), name="gateway-log-tail")
        self._tail.add_done_callback(_report_crash)
        self.producer = InputProducer(
            self.kafka, self.topics, client_id="gpuquota-gateway", security=self.kafka_security
        )
        await self.producer.start()
        port = KafkaCommandPort(
            self.producer,
            self.pool,
            projector,
            decision_timeout=self.decision_timeout,
            produce_timeout=self.produce_timeout,
            admission=self.admission,
        )
        front = self._front = GatewayFront(
            self.host, self.port, lambda: projector.state, self.read_model, wall_clock_ms, self.browser
        )
        gateway = self.gateway = Gateway(
            self.read_model,
            port,
            pool=self.pool,
            explainer=front.explainer,
            auth=self.auth,
            guard=front.guard,
        )
        self.registry = gateway_registry(gateway, lambda: projector.state)
        install(gateway, self.registry, self.probes(), lambda: projector.state, self.broken)
        NodeRoutes(gateway, self.node_logs).install()
        self.port = await front.serve(gateway)

    def broken(self) -> str | None:
        """The liveness check: the log tail runs and its read model could be rebuilt (``LogProjector``)."""
        tail = self._tail
        if tail is not None and tail.done() and not tail.cancelled():
            return f"the read model's log tail stopped: {tail.exception()!r}"
        return None if self.projector is None else self.projector.failure

    def probes(self) -> dict[str, Probe]:
        """``/health/ready``: the event log and the broker answer (and the broker acknowledges the
        gateway's inputs), the read model is caught up."""

        async def lag() -> int:
            assert self.store is not None and self.projector is not None
            return await self.store.last_seq(self.pool) - self.projector.seq

        reachable = broker_probe(self.kafka)

        async def broker() -> str | None:
            stuck = None if self.producer is None else self.producer.unavailable(self.produce_timeout)
            return stuck or await reachable()

        return {
            "eventLog": store_probe(lambda: self.store, self.pool),
            "broker": broker,
            "readModel": lag_probe(lag),
        }

    async def stop(self) -> None:
        if self._front is not None:
            await self._front.stop()
            self._front = None
        await cancel(self._tail)
        self._tail = None
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None
        if self.store is not None and self._own_store:
            await self.store.close()
            self.store = None


def _report_crash(task: asyncio.Task[None]) -> None:
    """A background loop must not die silently (its service would look alive but do nothing)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.critical("%s stopped: %r", task.get_name(), exc, exc_info=exc)


class NodeAgentService:
    """A ``NodeAgent`` connected to the scheduler through Kafka."""

    def __init__(
        self,
        kafka: str,
        node_id: str,
        pool: str,
        slots: tuple[SlotOffer, ...],
        runtime: Runtime,
        work_dir: Path,
        *,
        topics: KafkaTopics | None = None,
        heartbeat_seconds: float = DEFAULT_POLICY.heartbeat_seconds,
        preemption_grace: float = DEFAULT_POLICY.preemption_grace_seconds,
        logs_port: int | None = None,
        logs_host: str = "127.0.0.1",
        logs_token: str | None = None,
        address: str = "",
        kafka_security: KafkaSecurity = PLAINTEXT,
        data: DataPlane | None = None,
    ) -> None:
        self.link = KafkaNodeLink(kafka, topics or KafkaTopics(), node_id, pool, security=kafka_security)
        self.log_server = (
            None if logs_port is None else LogServer(work_dir, logs_host, logs_port, token=logs_token)
        )
        self.agent = NodeAgent(
            node_id,
            pool,
            slots,
            runtime,
            self.link.send,
            work_dir,
            heartbeat_seconds=heartbeat_seconds,
            preemption_grace=preemption_grace,
            address=address,
            data=data,
        )
        self._feed: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.log_server is not None:
            await self.log_server.start()
        await self.link.start()  # fixes the command position before the agent registers
        await self.agent.start()
        self._feed = asyncio.create_task(self.link.run(self.agent.deliver), name=f"node-{self.link.node_id}")
        self._feed.add_done_callback(_report_crash)

    async def stop(self) -> None:
        await self.agent.stop()
        await cancel(self._feed)
        self._feed = None
        await self.link.stop()
        if self.log_server is not None:
            await self.log_server.stop()


class DistributedStack:
    """Gateway, scheduler and local node agents in one process, over Kafka and PostgreSQL."""

    def __init__(
        self,
        kafka: str,
        database_url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8642,
        nodes: list[tuple[str, tuple[SlotOffer, ...]]] | None = None,
        runtime: Runtime | None = None,
        data_dir: Path = Path(".gpuquota"),
        topics: KafkaTopics | None = None,
        pool: str = "default",
        heartbeat_seconds: float = DEFAULT_POLICY.heartbeat_seconds,
        preemption_grace: float = DEFAULT_POLICY.preemption_grace_seconds,
        snapshot_every: int = 1000,
        auth: Keyring | None = None,
        browser: BrowserPolicy | None = None,
        kafka_security: KafkaSecurity = PLAINTEXT,
        leave_running: bool = False,
        data: DataPlane | None = None,
        s3_client: S3Client | None = None,
    ) -> None:
        self.topics = topics or KafkaTopics()
        self.lock = DirectoryLock(data_dir)
        self.s3_client = s3_client
        """What ``gpuquota env`` tells clients of the agents' S3 (``gpuquota up --s3``)."""
        self.leave_running = leave_running
        """``stop`` leaves the running attempts to the next start (``gpuquota up --leave-running``)."""
        self.scheduler = SchedulerService(
            SchedulerConfig(
                kafka=kafka,
                database_url=database_url,
                topics=self.topics,
                kafka_security=kafka_security,
                default_pool=pool,
                snapshot_every=snapshot_every,
                heartbeat_timeout_ms=SchedulingPolicy(
                    heartbeat_seconds=heartbeat_seconds
                ).heartbeat_timeout_ms,
                data_dir=data_dir,
            )
        )
        local = LocalLogs(lambda node_id: data_dir / "nodes" / node_id)  # its agents share its disk
        self.gateway = GatewayService(
            kafka,
            database_url,
            topics=self.topics,
            pool=pool,
            host=host,
            port=port,
            auth=auth,
            node_logs=local,
            browser=browser,
            kafka_security=kafka_security,
        )
        self.agents: list[NodeAgentService] = []
        if runtime is not None:
            for node_id, slots in nodes or []:
                service = NodeAgentService(
                    kafka,
                    node_id,
                    pool,
                    slots,
                    runtime,
                    data_dir / "nodes" / node_id,
                    topics=self.topics,
                    heartbeat_seconds=heartbeat_seconds,
                    preemption_grace=preemption_grace,
                    address="127.0.0.1",  # the stack's agents share this machine
                    kafka_security=kafka_security,
                    data=data,
                )
                self.agents.append(service)

    @property
    def url(self) -> str:
        return self.gateway.url

    async def start(self) -> None:
        self.lock.acquire()  # DirectoryInUse: another stack uses this data dir
        await self.scheduler.start()
        await self.gateway.start()
        if self.s3_client is not None and self.gateway.gateway is not None:
            self.gateway.gateway.s3_endpoint = self.s3_client.endpoint
            self.gateway.gateway.s3_client_key = self.s3_client.key
        for agent in self.agents:
            await agent.start()

    async def stop(self) -> None:
        await self.gateway.stop()
        if not self.leave_running:  # as the embedded stack: stopped, reported, requeued
            reason = "gpuquota up stopped: attempt stopped (the job runs again at the next start)"
            await asyncio.gather(*(a.agent.stop_attempts(reason) for a in self.agents))
        for agent in self.agents:
            await agent.stop()
        await self.scheduler.stop()
        self.lock.release()


# ----- process entry points -----------------------------------------------------------------------

Stoppable = Callable[[], Awaitable[None]]


async def serve(
    start: Stoppable,
    stop: Stoppable,
    ready: Callable[[], str] | str | None = None,
    failed: Awaitable[object] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until ``failed`` resolves to an error (exit 1).

    ``ready`` (a line, or a function giving it once started) is printed when ``start`` returns. A stop
    that takes long logs what it waits for (``startup.drain``).
    """
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(stopping.wait())]
    if failed is not None:
        waiters.append(asyncio.ensure_future(failed))
    try:
        await start()
        if ready is not None:
            print(ready if isinstance(ready, str) else ready(), flush=True)
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        error = next((w.result() for w in done if w is not waiters[0]), None)
        return 1 if error is not None else 0
    finally:
        for waiter in waiters:
            waiter.cancel()
        await drain(stop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Text with timestamps, or JSON (``GPUQUOTA_LOG_FORMAT``): ``gpuquota.observe.logs``."""
    from gpuquota.observe.logs import configure_logging as configure

    configure(level, fmt)


_S = TypeVar("_S", GatewaySettings, SchedulerSettings)


def _settings(command: str, kind: type[_S], environ: dict[str, str] | None) -> _S | None:
    """The service's settings from the environment, its logging configured; None (printed) if invalid."""
    from gpuquota.config.settings import SettingsError

    env = os.environ if environ is None else environ
    warn_unknown_variables(command, env)
    try:
        settings = kind.from_env(env)
    except SettingsError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
    configure_logging(settings.log_level, settings.log_format)
    return settings


def run_gateway(
    environ: dict[str, str] | None = None,
    auth_keys: str | None = None,
    allow_unauthenticated: bool = False,
    allowed_hosts: str | None = None,
    allowed_origins: str | None = None,
) -> int:
    """``gpuquota gateway``: ``auth_keys`` (``--auth-keys``) overrides ``GPUQUOTA_AUTH_KEYS``;
    ``allow_unauthenticated`` (``--allow-unauthenticated``) or its variable lifts the loopback rule;
    ``allowed_hosts`` and ``allowed_origins`` (``--allowed-hosts``, ``--allowed-origins``) override
    ``GPUQUOTA_ALLOWED_HOSTS`` and ``GPUQUOTA_ALLOWED_ORIGINS``."""
    from gpuquota.gateway.auth import load_auth
    from gpuquota.support.exposure import read_token

    settings = _settings("gpuquota gateway", GatewaySettings, environ)
    if settings is None:
        return 2
    path = auth_keys or (None if settings.auth_keys is None else str(settings.auth_keys))
    allow = allow_unauthenticated or settings.allow_unauthenticated
    try:  # before connecting to anything: a refused configuration never reaches the dependencies
        auth = load_auth(path, settings.host, "gpuquota gateway", allow)
        node_token = read_token(settings.node_token, settings.node_token_file)
        browser = BrowserPolicy.parse(
            allowed_hosts or settings.allowed_hosts, allowed_origins or settings.allowed_origins
        )
    except ValueError as exc:  # KeyConfigError, Exposed, TokenError
        print(f"gpuquota gateway: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        await wait_for_dependencies(
            "gpuquota gateway", settings.startup_timeout, settings.kafka, settings.database_url
        )
        service = GatewayService(
            settings.kafka,
            settings.database_url,
            topics=KafkaTopics(settings.topic_prefix),
            pool=settings.pool,
            host=settings.host,
            port=settings.port,
            auth=auth,
            node_logs=HttpLogs(settings.node_logs_url, node_token) if settings.node_logs_url else None,
            browser=browser,
            kafka_security=settings.kafka_security,
            produce_timeout=settings.produce_timeout,
            admission=Admission(settings.admission_max_backlog, settings.admission_max_seconds),
        )
        return await serve(service.start, service.stop, lambda: f"gpuquota gateway ready on {service.url}")

    return run_service("gpuquota gateway", main)


def run_scheduler(environ: dict[str, str] | None = None, metrics_port: int | None = None) -> int:
    """``gpuquota scheduler``: ``metrics_port`` (``--metrics-port``) overrides ``GPUQUOTA_METRICS_PORT``."""
    settings = _settings("gpuquota scheduler", SchedulerSettings, environ)
    if settings is None:
        return 2
    port = metrics_port if metrics_port is not None else settings.metrics_port
    config = SchedulerConfig(
        kafka=settings.kafka,
        database_url=settings.database_url,
        topics=KafkaTopics(settings.topic_prefix),
        kafka_security=settings.kafka_security,
        default_pool=settings.pool,
        snapshot_every=settings.snapshot_every,
        tick_seconds=settings.tick_seconds,
        heartbeat_timeout_ms=SchedulingPolicy(
            heartbeat_seconds=settings.heartbeat_seconds
        ).heartbeat_timeout_ms,
        data_dir=settings.data_dir,
        instance_id=settings.instance_id or None,
    )

    async def main() -> int:
        await wait_for_dependencies(
            "gpuquota scheduler", settings.startup_timeout, settings.kafka, settings.database_url
        )
        service = SchedulerService(config)
        ops = None if port is None else scheduler_ops(service, port)

        async def start() -> None:
            if ops is not None:
                await ops.start()  # live at once; ready once the service has started
            await service.start()
            gc.freeze()  # what start-up built (modules, faust, aiokafka) is never garbage

        async def stop() -> None:
            await service.stop()
            if ops is not None:
                await ops.stop()

        return await serve(start, stop, "gpuquota scheduler ready", service.wait())

    gc.set_threshold(*GC_THRESHOLDS)
    return run_service("gpuquota scheduler", main)
