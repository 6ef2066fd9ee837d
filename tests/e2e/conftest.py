"""Helpers of the end-to-end tests: node agents run REAL processes (the process runtime).

* ``Jobs``: payloads of the training job ``trainer.py`` and what its attempts wrote to ``out``;
  ``kill_all()`` is the safety net that leaves no job process behind, whatever the test did.
* ``Cluster`` (distributed mode): ``gpuquota scheduler`` and each node agent (``gpuquota node-agent``)
  as OS processes over Kafka and PostgreSQL, so a test can ``kill -9`` an agent; the gateway runs in
  this process.
* ``log_events``: the scheduler's log of a pool, from PostgreSQL or SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import pytest_asyncio

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.kafka import KafkaTopics, ensure_topics
from gpuquota.entrypoints.distributed import GatewayService
from gpuquota.wire.events import SchedulerEvent
from tests.pipeline.services import ServiceProcess

TRAINER = Path(__file__).with_name("trainer.py")
G5 = "ml.g5.xlarge"

#: a job that records its run in ``$OUT_DIR/<job id>`` (``x``: a second run of the job fails) and exits
SHORT_JOB = (
    "import os, time\n"
    "with open(os.path.join(os.environ['OUT_DIR'], os.environ['GPUQUOTA_JOB_ID']), 'x') as f:\n"
    "    f.write(os.environ['GPUQUOTA_NODE_ID'] + ' ' + os.environ['GPUQUOTA_ATTEMPT_ID'])\n"
    "time.sleep(0.05)\n"
)


def batch_client(url: str) -> Any:
    return boto3.client(
        "batch", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )


def poll(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)  # polling interval


async def apoll(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """``poll`` for async tests; ``condition`` may return an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)  # polling interval


class Jobs:
    """Payloads for ``trainer.py`` / ``SHORT_JOB`` and the files their attempts write to ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def trainer(self, unit: str = G5) -> str:
        return json.dumps(
            {
                "TrainingJobName": "e2e",
                "AlgorithmSpecification": {
                    "TrainingInputMode": "File",
                    "ContainerEntrypoint": [sys.executable, "-S"],
                    "ContainerArguments": [str(TRAINER)],
                },
                "ResourceConfig": {"InstanceType": unit, "InstanceCount": 1, "VolumeSizeInGB": 1},
                "Environment": {"OUT_DIR": str(self.out)},
                "StoppingCondition": {"MaxRuntimeInSeconds": 600},
            }
        )

    def short(self, unit: str = G5) -> str:
        return json.dumps(
            {
                "AlgorithmSpecification": {"ContainerEntrypoint": [sys.executable, "-S", "-c", SHORT_JOB]},
                "ResourceConfig": {"InstanceType": unit, "InstanceCount": 1},
                "Environment": {"OUT_DIR": str(self.out)},
            }
        )

    def marker(self, name: str, attempt: int, kind: str) -> dict[str, Any] | None:
        path = self.out / f"{name}.{attempt}.{kind}"
        return json.loads(path.read_text()) if path.exists() else None

    def started(self, name: str, attempt: int = 1, timeout: float = 60) -> dict[str, Any]:
        """The ``start`` record of an attempt, once the process wrote it."""
        found: dict[str, Any] = poll(
            lambda: self.marker(name, attempt, "start"), timeout, f"{name} attempt {attempt} to start"
        )
        return found

    def starts(self, name: str) -> list[int]:
        return sorted(int(p.name.split(".")[-2]) for p in self.out.glob(f"{name}.*.start"))

    def finish(self, name: str) -> None:
        (self.out / f"{name}.finish").write_text("now")

    def pids(self) -> list[int]:
        return [json.loads(p.read_text())["pid"] for p in self.out.glob("*.start")]

    def kill_all(self) -> None:
        for pid in self.pids():
            # each attempt is a process group (led by its exit wrapper) that the job belongs to
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    made = Jobs(tmp_path / "out")
    try:
        yield made
    finally:
        made.kill_all()


def kill_recorded(work_dir: Path) -> None:
    """Kill the process groups a node agent recorded in its ``state.json`` (left running on stop)."""
    try:
        doc = json.loads((work_dir / "state.json").read_text())
    except (OSError, ValueError):
        return
    for record in (doc.get("attempts") or {}).values():
        if pgid := record.get("pgid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


async def log_events(store: EventStore, pool: str) -> list[SchedulerEvent]:
    events: list[SchedulerEvent] = []
    after = 0
    while records := await store.read(pool, after_seq=after):
        for record in records:
            events.extend(record.events)
            after = record.seq
    return events


# ----- distributed mode with node agents as OS processes ------------------------------------------


class Cluster:
    """``gpuquota scheduler`` and ``gpuquota node-agent`` processes (``agent``) configured by their
    flags and ``GPUQUOTA_*`` variables, and the gateway in this process (its read model is the test's
    view of the scheduler's log).

    ``heartbeat_seconds`` is the agents' heartbeat period and the scheduler's ``GPUQUOTA_HEARTBEAT_SECONDS``:
    the scheduler declares a node lost after 6 periods without a heartbeat.
    """

    def __init__(
        self, kafka: str, database_url: str, root: Path, *, heartbeat_seconds: float, grace: float = 5.0
    ) -> None:
        run = uuid.uuid4().hex[:10]
        self.run = run
        self.kafka = kafka
        self.topics = KafkaTopics(f"e2e-{run}.")
        self.pool = f"p-{run}"
        self.root = root
        self.heartbeat_seconds = heartbeat_seconds
        self.grace = grace
        self.gateway = GatewayService(kafka, database_url, topics=self.topics, pool=self.pool, port=0)
        env = {
            "GPUQUOTA_KAFKA": kafka,
            "GPUQUOTA_DATABASE_URL": database_url,
            "GPUQUOTA_TOPIC_PREFIX": self.topics.prefix,
            "GPUQUOTA_POOL": self.pool,
            "GPUQUOTA_HEARTBEAT_SECONDS": str(heartbeat_seconds),
            "GPUQUOTA_TICK_SECONDS": "0.5",
            "GPUQUOTA_DATA_DIR": str(root / "scheduler"),
        }
        self.scheduler = ServiceProcess("scheduler", env, root / "scheduler.log")
        self.agents: list[ServiceProcess] = []
        self.batch: Any = None

    def node_id(self, name: str) -> str:
        """Node ids unique to the run (an agent commits its command offsets to a group named after it)."""
        return f"{name}-{self.run}"

    def work_dir(self, node_id: str) -> Path:
        return self.root / "nodes" / node_id

    async def start(self) -> None:
        await ensure_topics(self.kafka, self.topics, partitions=2)
        await asyncio.gather(self.scheduler.start(), self.gateway.start())
        self.batch = batch_client(self.gateway.url)

    def agent(self, node_id: str, slots: str, log_name: str | None = None) -> ServiceProcess:
        """A ``gpuquota node-agent`` process for ``node_id`` (not started yet)."""
        args = [
            "--kafka", self.kafka, "--node-id", node_id, "--pool", self.pool, "--slots", slots,
            "--runtime", "process", "--work-dir", str(self.work_dir(node_id)),
            "--heartbeat-seconds", str(self.heartbeat_seconds), "--preemption-grace", str(self.grace),
        ]  # fmt: skip
        log = self.root / f"{log_name or node_id}.log"
        process = ServiceProcess("node-agent", {"GPUQUOTA_TOPIC_PREFIX": self.topics.prefix}, log, args)
        self.agents.append(process)
        return process

    def online(self) -> set[str]:
        """Nodes the scheduler's log says are online (the gateway's projection of it)."""
        projector = self.gateway.projector
        assert projector is not None
        return {n.node_id for n in projector.state.nodes.values() if n.online}

    async def events(self) -> list[SchedulerEvent]:
        assert self.gateway.store is not None
        return await log_events(self.gateway.store, self.pool)

    def logs(self) -> str:
        return "\n".join(f"----- {p.log_path.name}\n{p.tail()}" for p in [self.scheduler, *self.agents])

    async def stop(self) -> None:
        for agent in self.agents:
            if agent.proc is not None:
                await agent.stop(timeout=10)
        if self.batch is not None:
            self.batch.close()
        await self.gateway.stop()
        if self.scheduler.proc is not None:
            await self.scheduler.stop(timeout=20)
        nodes = self.root / "nodes"
        for work_dir in nodes.iterdir() if nodes.is_dir() else ():
            kill_recorded(work_dir)  # stopped agents leave their job processes running (for adoption)


ClusterFactory = Callable[..., Awaitable[Cluster]]


@pytest_asyncio.fixture
async def cluster_factory(
    kafka_bootstrap: str, database_url: str, tmp_path: Path
) -> AsyncIterator[ClusterFactory]:
    """``await cluster_factory(heartbeat_seconds)``: a started ``Cluster``, stopped after the test."""
    made: list[Cluster] = []

    async def start(heartbeat_seconds: float, grace: float = 5.0) -> Cluster:
        cluster = Cluster(
            kafka_bootstrap, database_url, tmp_path, heartbeat_seconds=heartbeat_seconds, grace=grace
        )
        made.append(cluster)
        await cluster.start()
        return cluster

    try:
        yield start
    finally:
        for cluster in made:
            print(cluster.logs())  # shown with a failure's captured teardown output
            await cluster.stop()
