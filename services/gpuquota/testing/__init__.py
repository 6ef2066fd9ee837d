"""pytest plugin ``gpuquota.testing``: a running gpuquota stack for the tests of a training platform.

Installing gpuquota registers this module as a pytest plugin (the ``pytest11`` entry point), so any
test can ask for the ``gpuquota_stack`` fixture::

    def test_submit(gpuquota_stack):
        batch = gpuquota_stack.batch          # a ready boto3 "batch" client
        batch.create_scheduling_policy(...)

The fixture starts a fresh stack for each test and yields a :class:`GpuquotaStack`: a boto3 ``batch``
client, ``endpoint_url`` and ``kafka_bootstrap`` (None unless distributed). Where the stack comes from
(``--gpuquota-mode`` or ini ``gpuquota_mode``):

* ``auto`` (default): ``docker`` if a Docker daemon answers ``docker.from_env().ping()`` and the image
  is present locally, otherwise ``embedded``.
* ``embedded``: ``gpuquota up`` in this process, in a thread with its own event loop: gateway on a free
  port of 127.0.0.1, the scheduler, local node agents, the event log in SQLite under a temporary
  directory. No Kafka, no PostgreSQL, no Docker.
* ``docker``: a :class:`GpuquotaContainer` (testcontainers) of the gpuquota image (ini
  ``gpuquota_image``, default ``gpuquota:dev``, built by ``make images``) running ``gpuquota up``
  (embedded mode inside the container) on a mapped port.
* ``distributed``: gateway, Faust scheduler and node agents over a real Kafka broker and PostgreSQL
  (``--gpuquota-kafka`` / ``--gpuquota-database-url``, else ``KAFKA_BOOTSTRAP_SERVERS`` /
  ``DATABASE_URL``), with topics and pool unique to the test.

Nodes and runtime: ini ``gpuquota_nodes`` (default ``ml.g5.xlarge=3``: one node agent with three
instances) and ``gpuquota_runtime`` (default ``simulated``: no processes; a job "runs" for its
``Environment.GPUQUOTA_SIM_DURATION_SECONDS``, default 60), or per test
``@pytest.mark.gpuquota(nodes="ml.g5.xlarge=2,ml.p4d.24xlarge=1", runtime="process")``.

Outside pytest, :func:`start_stack` is the same thing as a context manager, and
:class:`GpuquotaContainer` (``gpuquota.testing.container``, imported from here on first use) is the docker
mode's container itself, for tests that manage their own testcontainers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, get_args

import pytest

from gpuquota.testing.defaults import DEFAULT_IMAGE, DEFAULT_NODES, REGION

if TYPE_CHECKING:
    from gpuquota.testing.container import GpuquotaContainer as GpuquotaContainer

Mode = Literal["auto", "embedded", "docker", "distributed"]
Runtime = Literal["simulated", "process"]

MODES: tuple[str, ...] = get_args(Mode)
RUNTIMES: tuple[str, ...] = get_args(Runtime)
TERMINAL = frozenset({"SUCCEEDED", "FAILED"})


class StackError(RuntimeError):
    """The stack could not be started (or a wait ran out of time)."""


@dataclass(frozen=True)
class StackOptions:
    """What kind of stack to start; see the module docstring."""

    mode: Mode = "auto"
    nodes: str = DEFAULT_NODES
    runtime: Runtime = "simulated"
    image: str = DEFAULT_IMAGE
    kafka: str | None = None
    database_url: str | None = None
    start_timeout: float = 60.0


@dataclass
class GpuquotaStack:
    """A running stack: ``batch`` (boto3 client), ``endpoint_url``, ``kafka_bootstrap``, ``mode``."""

    endpoint_url: str
    mode: Literal["embedded", "docker", "distributed"]
    kafka_bootstrap: str | None = None
    """The Kafka bootstrap servers in distributed mode; None otherwise."""
    topic_prefix: str = ""
    """The prefix of this stack's Kafka topics (distributed mode; see ``gpuquota.wire.topics``)."""
    pool: str = "default"
    batch: Any = field(init=False, repr=False)
    """A boto3 ``batch`` client for ``endpoint_url`` (dummy credentials, region us-east-1)."""

    def __post_init__(self) -> None:
        self.batch = self.client()

    def client(self, service: str = "batch", **kwargs: Any) -> Any:
        """Another boto3 client for this endpoint (the caller closes it)."""
        import boto3

        options: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region_name": REGION,
            "aws_access_key_id": "gpuquota-test",
            "aws_secret_access_key": "gpuquota-test",
            **kwargs,
        }
        return boto3.client(service, **options)

    def wait_for_status(self, job_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        """Poll DescribeServiceJob until the job is in one of ``statuses``; return the description.

        Raises ``StackError`` after ``timeout`` seconds, or at once if the job ends in another
        terminal status.
        """
        deadline = time.monotonic() + timeout
        while True:
            job: dict[str, Any] = self.batch.describe_service_job(jobId=job_id)
            status = job["status"]
            if status in statuses:
                return job
            if status in TERMINAL:
                raise StackError(f"job {job_id} ended {status} ({job.get('statusReason')}), not {statuses}")
            if time.monotonic() > deadline:
                raise StackError(
                    f"job {job_id} is {status} after {timeout:g} s, not {statuses}: {self.explain(job_id)}"
                )
            time.sleep(0.05)  # polling interval

    def explain(self, job_id: str) -> str:
        """The reason code and message of ``gpuquota explain`` (``GET /gpuquota/v1/jobs/ID/explain``)."""
        url = f"{self.endpoint_url}/gpuquota/v1/jobs/{urllib.parse.quote(job_id, safe='')}/explain"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except (OSError, ValueError) as exc:
            return f"(no explanation: {exc})"
        why = body.get("explanation") or {}
        return f"{why.get('reason')}: {why.get('message')}"

    def terminate_all_jobs(
        self, reason: str = "Terminated by gpuquota.testing", timeout: float = 60.0
    ) -> None:
        """Terminate every unfinished job of every queue and wait until all are finished.

        Node agents leave job processes running when they stop (a restarted agent adopts them), so the
        fixture calls this before stopping a stack whose runtime is ``process``.
        """
        pending: list[str] = []
        for page in self.batch.get_paginator("describe_job_queues").paginate():
            for queue in page["jobQueues"]:
                for status in ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING"):
                    query = {"jobQueue": queue["jobQueueName"], "jobStatus": status}
                    while True:
                        listed = self.batch.list_service_jobs(**query)
                        pending.extend(job["jobId"] for job in listed["jobSummaryList"])
                        if not listed.get("nextToken"):
                            break
                        query["nextToken"] = listed["nextToken"]
        for job_id in pending:
            self.batch.terminate_service_job(jobId=job_id, reason=reason)
        for job_id in pending:
            self.wait_for_status(job_id, *TERMINAL, timeout=timeout)

    def close(self) -> None:
        self.batch.close()


# ----- starting stacks ---------------------------------------------------------------------------------


class _Service(Protocol):
    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class _LoopThread:
    """An asyncio service run on its own event loop in a daemon thread, so sync tests can call it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, work: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        async def run() -> Any:
            return await work()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.call(self._finish, 30.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30.0)
            self.loop.close()

    async def _finish(self) -> None:
        """Cancel what the service left running and close the loop's async generators and executor."""
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.loop.shutdown_asyncgens()
        await self.loop.shutdown_default_executor()


@contextlib.contextmanager
def _run_service(make: Callable[[], _Service], timeout: float) -> Iterator[str]:
    """Build (inside the loop: aiokafka objects need a running loop), start, yield the URL, stop."""
    thread = _LoopThread("gpuquota-test-stack")
    try:

        async def build() -> _Service:
            return make()

        service: _Service = thread.call(build, timeout)
        try:
            thread.call(service.start, timeout)
        except BaseException:
            with contextlib.suppress(Exception):  # a half-started service: the start error matters
                thread.call(service.stop, 60.0)
            raise
        try:
            yield service.url
        finally:
            thread.call(service.stop, 60.0)
    finally:
        thread.close()


@contextlib.contextmanager
def _embedded(options: StackOptions, data_dir: Path) -> Iterator[GpuquotaStack]:
    from gpuquota.entrypoints.embedded import EmbeddedStack

    def make() -> EmbeddedStack:
        return EmbeddedStack(
            data_dir, "127.0.0.1", 0, options.nodes, options.runtime, tick_seconds=0.5, preemption_grace=5.0
        )

    with _run_service(make, options.start_timeout) as url:
        yield GpuquotaStack(url, "embedded")


@contextlib.contextmanager
def _distributed(options: StackOptions, data_dir: Path) -> Iterator[GpuquotaStack]:
    from gpuquota.adapters.kafka import KafkaTopics
    from gpuquota.entrypoints.distributed import DistributedStack
    from gpuquota.entrypoints.embedded import node_plans, node_slots
    from gpuquota.node_agent import make_runtime

    kafka, database_url = options.kafka, options.database_url
    if not kafka or not database_url:
        raise StackError(
            "distributed mode needs --gpuquota-kafka and --gpuquota-database-url "
            "(or KAFKA_BOOTSTRAP_SERVERS and DATABASE_URL)"
        )
    run = uuid.uuid4().hex[:10]
    prefix, pool = f"t{run}.", f"p-{run}"
    # node ids unique to the run: a node agent commits its offsets to a group named after its node
    nodes = [(f"{node_id}-{run}", slots) for node_id, slots in node_slots(options.nodes)]
    plans = {f"{node_id}-{run}": plan for node_id, plan in node_plans(options.nodes).items()}

    def make() -> DistributedStack:
        return DistributedStack(
            kafka,
            database_url,
            port=0,
            nodes=nodes,
            node_plans=plans,
            runtime=make_runtime(options.runtime),
            data_dir=data_dir,
            topics=KafkaTopics(prefix),
            pool=pool,
            heartbeat_seconds=1.0,
            preemption_grace=5.0,
        )

    with _run_service(make, options.start_timeout) as url:
        yield GpuquotaStack(url, "distributed", kafka, prefix, pool)


@contextlib.contextmanager
def _container(options: StackOptions) -> Iterator[GpuquotaStack]:
    from gpuquota.testing.container import GpuquotaContainer

    container = GpuquotaContainer(
        options.image, nodes=options.nodes, runtime=options.runtime, start_timeout=options.start_timeout
    )
    with container:
        yield GpuquotaStack(container.get_endpoint_url(), "docker")


@functools.cache
def docker_image_available(image: str) -> bool:
    """True if a Docker daemon answers ``ping()`` and has ``image`` locally."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    # docker-py leaks the socket of a failed connect: keep its ResourceWarning out of the tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=5)
            try:
                if not client.ping():
                    return False
                client.images.get(image)
                return True
            finally:
                client.close()
        except Exception:
            return False
        finally:
            gc.collect()


def resolve_mode(options: StackOptions) -> Literal["embedded", "docker", "distributed"]:
    if options.mode == "auto":
        return "docker" if docker_image_available(options.image) else "embedded"
    return options.mode


@contextlib.contextmanager
def start_stack(options: StackOptions | None = None, data_dir: Path | None = None) -> Iterator[GpuquotaStack]:
    """A running stack for the duration of the ``with`` block (``data_dir``: default a temp dir)."""
    options = options or StackOptions()
    mode = resolve_mode(options)
    with contextlib.ExitStack() as resources:
        if data_dir is None and mode != "docker":
            data_dir = Path(resources.enter_context(tempfile.TemporaryDirectory(prefix="gpuquota-test-")))
        if mode == "embedded":
            assert data_dir is not None
            stack = resources.enter_context(_embedded(options, data_dir))
        elif mode == "distributed":
            assert data_dir is not None
            stack = resources.enter_context(_distributed(options, data_dir))
        else:
            stack = resources.enter_context(_container(options))
        resources.callback(stack.close)
        try:
            yield stack
        finally:
            if options.runtime == "process" and mode != "docker":
                stack.terminate_all_jobs()  # no job process may outlive the stack


# ----- the pytest plugin ---------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuquota", "gpuquota stack fixture (gpuquota.testing)")
    group.addoption(
        "--gpuquota-mode",
        choices=MODES,
        default=None,
        help="where gpuquota_stack comes from: auto (docker if available, else embedded), embedded, "
        "docker or distributed (default: ini gpuquota_mode, else auto)",
    )
    group.addoption("--gpuquota-kafka", default=None, help="distributed mode: Kafka bootstrap servers")
    group.addoption("--gpuquota-database-url", default=None, help="distributed mode: PostgreSQL URL")
    parser.addini("gpuquota_mode", "auto, embedded, docker or distributed (default auto)", default="auto")
    parser.addini("gpuquota_nodes", f"local node agents, UNIT=COUNT,... (default {DEFAULT_NODES})")
    parser.addini("gpuquota_runtime", "simulated or process (default simulated)", default="simulated")
    parser.addini("gpuquota_image", f"image for the docker mode (default {DEFAULT_IMAGE})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpuquota(nodes=None, runtime=None): node agents (UNIT=COUNT,...) and runtime "
        "(simulated|process) of this test's gpuquota_stack",
    )


def stack_options(config: pytest.Config, marker: pytest.Mark | None = None) -> StackOptions:
    """The options of ``gpuquota_stack`` from the command line, the ini file and the test's marker."""
    mode = config.getoption("--gpuquota-mode") or str(config.getini("gpuquota_mode")) or "auto"
    runtime = str(config.getini("gpuquota_runtime")) or "simulated"
    nodes = str(config.getini("gpuquota_nodes")) or DEFAULT_NODES
    if marker is not None:
        unknown = set(marker.kwargs) - {"nodes", "runtime"}
        if marker.args or unknown:
            raise pytest.UsageError(f"@pytest.mark.gpuquota takes only nodes= and runtime=, not {marker}")
        nodes = str(marker.kwargs.get("nodes") or nodes)
        runtime = str(marker.kwargs.get("runtime") or runtime)
    if mode not in MODES:
        raise pytest.UsageError(f"gpuquota_mode must be one of {', '.join(MODES)}, not {mode!r}")
    if runtime not in RUNTIMES:
        raise pytest.UsageError(f"gpuquota runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    return StackOptions(
        mode=cast(Mode, mode),
        nodes=nodes,
        runtime=cast(Runtime, runtime),
        image=str(config.getini("gpuquota_image")) or DEFAULT_IMAGE,
        kafka=config.getoption("--gpuquota-kafka") or os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        database_url=config.getoption("--gpuquota-database-url") or os.environ.get("DATABASE_URL"),
    )


@pytest.fixture
def gpuquota_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GpuquotaStack]:
    """A fresh gpuquota stack for this test; see :mod:`gpuquota.testing`."""
    options = stack_options(request.config, request.node.get_closest_marker("gpuquota"))
    data_dir = None if resolve_mode(options) == "docker" else tmp_path_factory.mktemp("gpuquota")
    with start_stack(options, data_dir) as stack:
        yield stack


def __getattr__(name: str) -> Any:
    """``GpuquotaContainer`` on first use: the plugin itself loads without testcontainers installed."""
    if name == "GpuquotaContainer":
        from gpuquota.testing.container import GpuquotaContainer

        return GpuquotaContainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
