"""The embedded stack (``gpuquota up``): scheduler shell, HTTP gateway and local node agents in one process.

The event log lives in SQLite under ``data_dir`` (``events.sqlite3``), so a restart continues where the
last run stopped: the shell folds the log back into its state and read model before the gateway
listens. Node agents talk to the shell directly: their inputs go to ``shell.handle`` and the shell's
node commands are routed to ``agents[command.node_id].deliver``.

Stopping (Ctrl-C, SIGTERM) stops the running attempts first, each reported STOPPED so its job is
requeued for the next start: nothing is left running that a deleted data directory would orphan.
With ``leave_running`` (``--leave-running``) they run on, recorded, for the next start to adopt.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuquota.adapters.event_store import EventStore, InMemoryEventStore
from gpuquota.adapters.sqlite_store import STORE_FILE
from gpuquota.config.environ import SettingsError, forget_secrets
from gpuquota.config.image_map import IMAGE_MAP_ENV
from gpuquota.config.kafka import PLAINTEXT, KafkaClientSettings, KafkaSecurity
from gpuquota.config.settings import admission_from_env
from gpuquota.core.policy import DEFAULT_POLICY, SchedulingPolicy
from gpuquota.entrypoints.gateway_front import GatewayFront
from gpuquota.entrypoints.local_s3 import LocalS3Error, S3Client, s3_client, s3_settings
from gpuquota.gateway import EmbeddedCommandPort, Gateway
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.auth import AUTH_KEYS_ENV, Keyring, add_auth_keys, load_auth
from gpuquota.gateway.browser_guard import (
    ALLOWED_HOSTS_ENV,
    ALLOWED_ORIGINS_ENV,
    BrowserPolicy,
    add_browser_flags,
)
from gpuquota.gateway.node_routes import LocalLogs, NodeRoutes
from gpuquota.gateway.ops import gateway_registry, install
from gpuquota.node_agent import RUNTIMES, NodeAgent, make_runtime
from gpuquota.node_agent.container import ENGINES
from gpuquota.node_agent.s3_stage import DataPlane, data_plane
from gpuquota.node_agent.slots import node_plan_groups, node_slot_groups
from gpuquota.observe.health import store_probe
from gpuquota.observe.logs import configure_logging
from gpuquota.observe.metrics import Timings
from gpuquota.observe.startup import drain, run_loop, warn_unknown_variables
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import Projector
from gpuquota.scheduler.loop import GC_THRESHOLDS
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.support.arns import ArnFactory
from gpuquota.support.dirlock import DirectoryLock
from gpuquota.support.exposure import allowed_by_env
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand

log = logging.getLogger(__name__)

DEFAULT_NODES = "ml.g5.xlarge=3"
LOCAL_ADDRESS = "127.0.0.1"
"""Where the local node agents reach each other (the instances of an attempt spread over them)."""
STOPPED_REASON = "gpuquota up stopped: attempt stopped (the job runs again at the next start)"


def node_slots(nodes: str) -> list[tuple[str, tuple[SlotOffer, ...]]]:
    """One local node per ``UNIT=SLOTS`` entry, ``NODES`` for ``UNIT=SLOTSxNODES``: ``("local-1", slots),
    ...`` (GPU indices never shared)."""
    return [(f"local-{i}", slots) for i, slots in enumerate(node_slot_groups(nodes), start=1)]


def node_plans(nodes: str) -> dict[str, str]:
    """The training plan of each local node of ``node_slots(nodes)`` that has one (``TYPE=N@PLAN``)."""
    return {f"local-{i}": plan for i, plan in enumerate(node_plan_groups(nodes), start=1) if plan is not None}


async def open_store(data_dir: Path | None) -> EventStore:
    if data_dir is None:
        return InMemoryEventStore()
    from gpuquota.adapters.sqlite_store import SqliteEventStore

    data_dir.mkdir(parents=True, exist_ok=True)
    return await SqliteEventStore.open(data_dir / STORE_FILE)


class SchedulerFailed(Exception):
    """The scheduler loop failed (fail fast): ``gpuquota up`` exits 1, to be restarted."""


class EmbeddedStack:
    """Start with ``await stack.start()``; ``stack.url`` is then the gateway's address."""

    def __init__(
        self,
        data_dir: str | Path | None = ".gpuquota",
        host: str = "127.0.0.1",
        port: int = 8642,
        nodes: str = DEFAULT_NODES,
        runtime: str = "process",
        *,
        container_engine: str | None = None,
        image_map: str = "",
        tick_seconds: float = DEFAULT_POLICY.tick_seconds,
        heartbeat_seconds: float = DEFAULT_POLICY.heartbeat_seconds,
        preemption_grace: float = DEFAULT_POLICY.preemption_grace_seconds,
        arns: ArnFactory | None = None,
        auth: Keyring | None = None,
        browser: BrowserPolicy | None = None,
        leave_running: bool = False,
        data: DataPlane | None = None,
        s3_client: S3Client | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.admission = admission or Admission()
        """The gateway's admission control (``GPUQUOTA_ADMISSION_*``), as ``gpuquota gateway``'s."""
        self.data = data
        """The node agents' S3 (``--s3``; None: none)."""
        self.s3_client = s3_client
        """What ``gpuquota env`` tells clients of that S3 (the gateway's ``/gpuquota/v1/env``)."""
        # absolute: the jobs' directories derive from it, and a job's working directory is elsewhere
        self.data_dir = None if data_dir is None else Path(data_dir).absolute()
        self.lock = None if self.data_dir is None else DirectoryLock(self.data_dir)
        self.host = host
        self.port = port
        self.nodes = nodes
        self.runtime = runtime
        self.container_engine = container_engine
        self.image_map = image_map
        """The container runtime's image rewrites (``GPUQUOTA_IMAGE_MAP``'s text)."""
        self.tick_seconds = tick_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.preemption_grace = preemption_grace
        self.arns = arns or ArnFactory()
        self.auth = auth
        self.browser = browser
        self.leave_running = leave_running
        """``stop`` leaves the running attempts to the next start (adopted), instead of stopping them."""
        self.store: EventStore | None = None
        self.shell: SchedulerShell | None = None
        self.gateway: Gateway | None = None
        self.registry: CollectorRegistry | None = None
        self.agents: dict[str, NodeAgent] = {}
        self._front: GatewayFront | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        if self.lock is not None:
            self.lock.acquire()  # DirectoryInUse: another stack writes this log
        # ValueError: no engine, a bad image map
        runtime = make_runtime(self.runtime, self.container_engine, self.image_map)
        timings = Timings()
        self.store = await open_store(self.data_dir)
        shell = self.shell = SchedulerShell(
            self.store,
            Projector(ReadModel(self.arns)),
            tick_seconds=self.tick_seconds,
            heartbeat_timeout_ms=SchedulingPolicy(
                heartbeat_seconds=self.heartbeat_seconds
            ).heartbeat_timeout_ms,
            on_append=timings.appended,
        )
        folded = await shell.recover()
        log.info("recovered %d log records", folded)
        shell.node_command_sink = self._route
        shell.on_step = timings.step.observe
        front = self._front = GatewayFront(
            self.host, self.port, lambda: shell.state, shell.read_model, shell.clock, self.browser
        )
        gateway = self.gateway = Gateway(
            shell.read_model,
            EmbeddedCommandPort(shell, self.admission),
            clock=shell.clock,
            explainer=front.explainer,
            auth=self.auth,
            guard=front.guard,
            admission=self.admission,
        )
        if self.s3_client is not None:
            gateway.s3_endpoint, gateway.s3_client_key = self.s3_client.endpoint, self.s3_client.key
        self.registry = gateway_registry(gateway, lambda: shell.state, timings)
        probes = {"eventLog": store_probe(lambda: self.store, shell.pool, lambda: shell.write_failure)}
        # The shell decides on after a projection error: liveness makes it visible (503).
        install(gateway, self.registry, probes, lambda: shell.state, lambda: shell.projector.failure)
        work_root = (self.data_dir or Path(".gpuquota").absolute()) / "nodes"
        local = LocalLogs(lambda node_id: work_root / node_id if node_id in self.agents else None)
        NodeRoutes(gateway, local).install()
        self.port = await front.serve(gateway)
        plans = node_plans(self.nodes)
        for node_id, slots in node_slots(self.nodes):
            agent = NodeAgent(
                node_id,
                "default",
                slots,
                runtime,
                shell.handle,
                work_root / node_id,
                heartbeat_seconds=self.heartbeat_seconds,
                preemption_grace=self.preemption_grace,
                address=LOCAL_ADDRESS,
                send_many=lambda messages: handle_in_order(shell, messages),
                data=self.data,
                training_plan=plans.get(node_id),
            )
            self.agents[node_id] = agent
            await agent.start()
        # Ticks start once the agents' registrations are on their way: after a long downtime, the first
        # tick would otherwise declare the nodes lost (S5.7) and their running attempts be requeued.
        await shell.start()

    async def _route(self, command: NodeCommand) -> None:
        agent = self.agents.get(command.node_id)
        if agent is None:
            log.warning("no local agent for node %s: dropped %s", command.node_id, command.type)
            return
        await agent.deliver(command)

    async def stop(self) -> None:
        if self._front is not None:
            await self._front.stop()
            self._front = None
        if not self.leave_running:  # processes and containers are not left to a deleted data dir
            await asyncio.gather(*(a.stop_attempts(STOPPED_REASON) for a in self.agents.values()))
        for agent in self.agents.values():
            await agent.stop()
        self.agents.clear()
        if self.shell is not None:
            await self.shell.stop()
        if self.store is not None:
            await self.store.close()
            self.store = None
        if self.lock is not None:
            self.lock.release()


async def handle_in_order(
    shell: SchedulerShell, messages: list[SchedulerInput]
) -> list[BaseException | None]:
    """A node agent's queued reports, handed to the shell at once: they join one group commit, in order
    (``handle`` queues its input before it first waits), instead of one commit's round trip each."""
    results = await asyncio.gather(*(shell.handle(m) for m in messages), return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


# ----- ``gpuquota up`` ----------------------------------------------------------------------------


def configure_up(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--data-dir", default=".gpuquota", help="event log and node work directories (default ./.gpuquota)")
    add("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    add("--port", type=int, default=None, help="HTTP port (GPUQUOTA_PORT, default 8642)")
    add(
        "--nodes",
        default=DEFAULT_NODES,
        help=f'local node agents: one per TYPE=SLOTS, NODES per TYPE=SLOTSxNODES, e.g. "{DEFAULT_NODES},'
        'ml.p4d.24xlarge=1", "ml.g5.xlarge=1x2" (two nodes of one slot); TYPE=SLOTS@PLAN: nodes of '
        'training plan PLAN, e.g. "ml.g5.xlarge=3,ml.g5.xlarge=2@p1"',
    )
    add("--runtime", choices=RUNTIMES, default="process", help="how attempts run")
    add("--container-engine", choices=ENGINES, default=None, help="--runtime container: podman or docker")
    add("--kafka", default=None, help="distributed mode: Kafka bootstrap servers (GPUQUOTA_KAFKA)")
    add("--database-url", default=None, help="distributed mode: PostgreSQL URL (GPUQUOTA_DATABASE_URL)")
    add(
        "--s3",
        default=None,
        metavar="local|URL",
        help="the jobs' S3 (channels, checkpoints, model.tar.gz): local starts deploy/local/s3.sh and stops "
        "it on exit; URL an S3-compatible endpoint (GPUQUOTA_S3_ENDPOINT_URL; keys GPUQUOTA_S3_*)",
    )
    add(
        "--preemption-grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between SIGTERM and SIGKILL when a job is preempted or stopped "
        "(GPUQUOTA_PREEMPTION_GRACE, default 30)",
    )
    add(
        "--leave-running",
        action="store_true",
        help="on stop (Ctrl-C, SIGTERM) leave running jobs to the next start, which adopts them "
        "(default: stop them, SIGTERM then the preemption grace)",
    )
    add_auth_keys(parser)
    add_browser_flags(parser)


def run_up(args: argparse.Namespace) -> int:
    distributed = (
        args.kafka,
        args.database_url,
        os.environ.get("GPUQUOTA_KAFKA"),
        os.environ.get("GPUQUOTA_DATABASE_URL"),
    )
    port = args.port if args.port is not None else int(os.environ.get("GPUQUOTA_PORT", "8642"))
    warn_unknown_variables("gpuquota up", os.environ)
    try:
        configure_logging(
            os.environ.get("GPUQUOTA_LOG_LEVEL", "INFO"), os.environ.get("GPUQUOTA_LOG_FORMAT", "text")
        )
    except ValueError as exc:
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 2
    try:
        args.preemption_grace = grace(args)
        allow = args.allow_unauthenticated or allowed_by_env(os.environ)
        auth = load_auth(args.auth_keys or os.environ.get(AUTH_KEYS_ENV), args.host, "gpuquota up", allow)
        browser = BrowserPolicy.parse(
            args.allowed_hosts or os.environ.get(ALLOWED_HOSTS_ENV),
            args.allowed_origins or os.environ.get(ALLOWED_ORIGINS_ENV),
        )
    except ValueError as exc:  # KeyConfigError, Exposed: before anything starts
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 2
    kafka = args.kafka or os.environ.get("GPUQUOTA_KAFKA")
    database_url = args.database_url or os.environ.get("GPUQUOTA_DATABASE_URL")
    try:  # distributed mode's Kafka credentials (GPUQUOTA_KAFKA_*), before their secrets are forgotten
        environ = {**os.environ, "GPUQUOTA_KAFKA": kafka or ""}
        security = KafkaClientSettings.from_env(environ).kafka_security if kafka else PLAINTEXT
    except (SettingsError, ValueError) as exc:
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 2
    try:  # the gateway's admission bounds, as gpuquota gateway reads them
        admission = Admission.of(admission_from_env(os.environ))
    except SettingsError as exc:
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 2
    try:  # the node agents' S3 (--s3, GPUQUOTA_S3_*), before its secret is forgotten
        s3, local_s3 = s3_settings(args.s3, os.environ, Path(args.data_dir))
    except (SettingsError, LocalS3Error) as exc:
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 2
    try:
        client = s3_client(s3, local_s3)
        plane = data_plane(s3)
        up = Serving(port, auth, browser, security, plane, client, admission)
        return _run_up(args, distributed, kafka, database_url, up)
    finally:
        if local_s3 is not None:
            local_s3.stop()


def grace(args: argparse.Namespace) -> float:
    """``--preemption-grace``, else ``GPUQUOTA_PREEMPTION_GRACE``, else 30 s; ValueError if not a
    number of seconds in [0, 86400] (the node agent's bounds)."""
    given = args.preemption_grace
    seconds = float(given if given is not None else os.environ.get("GPUQUOTA_PREEMPTION_GRACE", "30"))
    if not 0 <= seconds <= 86400:
        raise ValueError(f"the preemption grace must be 0 to 86400 seconds, not {seconds:g}")
    return seconds


@dataclass(frozen=True)
class Serving:
    """What ``gpuquota up`` read before anything starts, for either mode."""

    port: int
    auth: Keyring | None
    browser: BrowserPolicy
    security: KafkaSecurity
    data: DataPlane
    s3: S3Client | None
    admission: Admission


def _run_up(
    args: argparse.Namespace,
    distributed: tuple[str | None, ...],
    kafka: str | None,
    database_url: str | None,
    up: Serving,
) -> int:
    forget_secrets(os.environ)  # read: the jobs of the local agents do not inherit them
    if any(distributed):
        if not kafka or not database_url:
            print("gpuquota up: the distributed mode needs both --kafka and --database-url", file=sys.stderr)
            return 2
        return _run_distributed(args, kafka, database_url, up)
    stack = EmbeddedStack(
        args.data_dir,
        args.host,
        up.port,
        args.nodes,
        args.runtime,
        auth=up.auth,
        container_engine=args.container_engine,
        image_map=os.environ.get(IMAGE_MAP_ENV, ""),
        browser=up.browser,
        leave_running=args.leave_running,
        data=up.data,
        s3_client=up.s3,
        preemption_grace=args.preemption_grace,
        admission=up.admission,
    )
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        run_loop(_serve(stack))
    except (OSError, ValueError, SchedulerFailed) as exc:
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_distributed(args: argparse.Namespace, kafka: str, database_url: str, up: Serving) -> int:
    from gpuquota.adapters.kafka import KafkaTopics
    from gpuquota.entrypoints.distributed import DistributedStack
    from gpuquota.entrypoints.serve import serve
    from gpuquota.observe.startup import run_service, wait_for_dependencies

    async def main() -> int:
        timeout = float(os.environ.get("GPUQUOTA_STARTUP_TIMEOUT", "60"))
        await wait_for_dependencies("gpuquota up", timeout, kafka, database_url)
        stack = DistributedStack(
            kafka,
            database_url,
            host=args.host,
            port=up.port,
            nodes=node_slots(args.nodes),
            node_plans=node_plans(args.nodes),
            runtime=make_runtime(args.runtime, args.container_engine, os.environ.get(IMAGE_MAP_ENV, "")),
            data_dir=Path(args.data_dir).absolute(),
            topics=KafkaTopics(os.environ.get("GPUQUOTA_TOPIC_PREFIX", "")),
            pool=os.environ.get("GPUQUOTA_POOL", "default"),
            auth=up.auth,
            browser=up.browser,
            kafka_security=up.security,
            leave_running=args.leave_running,
            data=up.data,
            s3_client=up.s3,
            preemption_grace=args.preemption_grace,
            admission=up.admission,
        )
        ready = lambda: f"gpuquota ready on {stack.url}"  # noqa: E731
        return await serve(stack.start, stack.stop, ready, stack.scheduler.wait())

    try:
        return run_service("gpuquota up", main)
    except ValueError as exc:
        print(f"gpuquota up: {exc}", file=sys.stderr)
        return 1


async def _serve(stack: EmbeddedStack) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stack.start()
        gc.freeze()  # what start-up built (modules, the state recovered from the log) is never garbage
        print(f"gpuquota ready on {stack.url}", flush=True)
        assert stack.shell is not None
        failed = asyncio.ensure_future(stack.shell.wait())
        stopped = asyncio.ensure_future(stopping.wait())
        await asyncio.wait((failed, stopped), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if failed.done():
            raise SchedulerFailed(str(failed.result()))
        failed.cancel()
    finally:
        await drain(stack.stop)  # a slow stop logs what it waits for
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
