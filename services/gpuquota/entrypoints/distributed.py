"""The distributed mode's services: gateway, scheduler and node agents over Kafka and PostgreSQL.

* ``GatewayService``: the AWS Batch HTTP gateway; writes are produced to the inputs topic, the read
  model tails the pool's log in PostgreSQL (see ``gateway.kafka_port``).
* ``SchedulerService`` (``scheduler.faust_app``): the faust app that decides.
* ``NodeAgentService``: one node agent whose ``send`` and commands go through ``KafkaNodeLink``.
* ``DistributedStack``: all three in one process (``gpuquota up --kafka ... --database-url ...``).

``gpuquota gateway``, ``gpuquota scheduler`` and ``gpuquota node-agent`` run one service each
(``entrypoints.serve``, ``entrypoints.node_agent``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.kafka import InputProducer, KafkaTopics, ensure_topics
from gpuquota.config.kafka import PLAINTEXT, KafkaSecurity
from gpuquota.core.policy import DEFAULT_POLICY, SchedulingPolicy
from gpuquota.entrypoints.gateway_front import GatewayFront
from gpuquota.entrypoints.local_s3 import S3Client
from gpuquota.gateway import Gateway
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.auth import Keyring
from gpuquota.gateway.browser_guard import BrowserPolicy
from gpuquota.gateway.kafka_port import KafkaCommandPort, cancel
from gpuquota.gateway.log_tail import LogProjector
from gpuquota.gateway.node_routes import LocalLogs, LogReader, NodeRoutes
from gpuquota.gateway.ops import gateway_registry, install
from gpuquota.node_agent import NodeAgent, Runtime
from gpuquota.node_agent.kafka_link import KafkaNodeLink
from gpuquota.node_agent.logs import LogServer
from gpuquota.node_agent.s3_stage import DataPlane
from gpuquota.observe.health import Probe, broker_probe, lag_probe, store_probe
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import Projector
from gpuquota.scheduler.faust_app import SchedulerConfig, SchedulerService, connect_store
from gpuquota.support.arns import ArnFactory
from gpuquota.support.clock import wall_clock_ms
from gpuquota.support.dirlock import DirectoryLock
from gpuquota.wire.base import SlotOffer

log = logging.getLogger(__name__)


@dataclass(eq=False)
class GatewayService:
    """The HTTP gateway of one pool in distributed mode; ``url`` and ``gateway`` once started."""

    kafka: str
    database_url: str
    topics: KafkaTopics = field(default_factory=KafkaTopics, kw_only=True)
    pool: str = field(default="default", kw_only=True)
    host: str = field(default="127.0.0.1", kw_only=True)
    port: int = field(default=8080, kw_only=True)
    arns: InitVar[ArnFactory | None] = field(default=None, kw_only=True)
    decision_timeout: float = field(default=5.0, kw_only=True)
    produce_timeout: float = field(default=5.0, kw_only=True)
    """Seconds the broker has to acknowledge an input before the request is a 503."""
    admission: Admission = field(default_factory=Admission, kw_only=True)
    store: EventStore | None = field(default=None, kw_only=True)
    auth: Keyring | None = field(default=None, kw_only=True)
    node_logs: LogReader | None = field(default=None, kw_only=True)
    """How ``gpuquota jobs logs`` reads a node's log: ``HttpLogs`` (``GPUQUOTA_NODE_LOGS_URL``)."""
    browser: BrowserPolicy | None = field(default=None, kw_only=True)
    kafka_security: KafkaSecurity = field(default=PLAINTEXT, kw_only=True)
    read_model: ReadModel = field(init=False)
    projector: LogProjector | None = field(default=None, init=False)
    producer: InputProducer | None = field(default=None, init=False)
    gateway: Gateway | None = field(default=None, init=False)
    registry: CollectorRegistry | None = field(default=None, init=False)
    _own_store: bool = field(init=False)
    _front: GatewayFront | None = field(default=None, init=False)
    _tail: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self, arns: ArnFactory | None) -> None:
        self.read_model = ReadModel(arns)
        self._own_store = self.store is None

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
            admission=self.admission,
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
        training_plan: str | None = None,
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
            training_plan=training_plan,
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
        node_plans: dict[str, str] | None = None,
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
        admission: Admission | None = None,
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
            admission=admission or Admission(),
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
                    training_plan=(node_plans or {}).get(node_id),
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
