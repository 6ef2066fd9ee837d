"""SIGTERM of an idle service: it drains and exits 0 within ``IDLE_EXIT_SECONDS`` (issue #30).

Each service runs as a real process: ``gpuquota up`` (embedded, process runtime), and, with the
suite's Kafka and PostgreSQL (``integration``), ``gpuquota scheduler``, ``gpuquota gateway`` and
``gpuquota node-agent`` (``tests.pipeline.services.Services``). A service is idle once its
``/health/ready`` answers 200; the time measured runs from the signal to the exit status. A stop that
really waits (a gateway's write waiting for a decision that no scheduler makes) logs what it waits
for. Every test prints one ``SHUTDOWN`` line with its figures.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpuquota.adapters.kafka import KafkaTopics, ensure_topics
from tests.e2e.faults import Up
from tests.pipeline.services import ServiceProcess, Services, batch_client, free_port

pytestmark = pytest.mark.slow

IDLE_EXIT_SECONDS = 1.0


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def until_ready(port: int, service: ServiceProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(ready, port):
        assert service.alive, service.tail()
        assert time.monotonic() < deadline, f"not ready within {timeout:g} s:\n{service.tail()}"
        await asyncio.sleep(0.1)  # polling interval


async def timed_stop(service: ServiceProcess) -> tuple[int, float]:
    """SIGTERM; the exit status and the seconds until it."""
    began = time.monotonic()
    status = await service.stop(timeout=30)
    return status, time.monotonic() - began


async def test_idle_gpuquota_up_exits_within_a_second(tmp_path: Path) -> None:
    up = Up(tmp_path, "ml.g5.xlarge=2")
    await up.start()
    assert up.process is not None
    try:
        await until_ready(int(up.url.rsplit(":", 1)[1]), up.process)
        status, seconds = await timed_stop(up.process)
    finally:
        await up.process.kill()
    print(f"SHUTDOWN gpuquota up (embedded, idle): exit {status} after {seconds:.3f} s")
    assert status == 0, up.logs()
    assert seconds < IDLE_EXIT_SECONDS, up.logs()


@pytest_asyncio.fixture
async def services(kafka_bootstrap: str, database_url: str, tmp_path: Path) -> AsyncIterator[Services]:
    run = uuid.uuid4().hex[:10]
    topics = KafkaTopics(f"sd-{run}.")
    await ensure_topics(kafka_bootstrap, topics, partitions=2)
    made = Services(kafka_bootstrap, database_url, topics.prefix, f"p-{run}", tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest.mark.integration
async def test_idle_distributed_services_exit_within_a_second(services: Services) -> None:
    ports = {"scheduler": free_port(), "gateway": free_port(), "node-agent": free_port()}
    running = {
        "scheduler": services.scheduler(GPUQUOTA_METRICS_PORT=str(ports["scheduler"])),
        "gateway": services.gateway(ports["gateway"]),
        "node-agent": services.node_agent("node-sd", env={"GPUQUOTA_METRICS_PORT": str(ports["node-agent"])}),
    }
    await asyncio.gather(*(service.start() for service in running.values()))
    await asyncio.gather(*(until_ready(ports[name], service) for name, service in running.items()))
    figures = {}
    for name, service in running.items():  # one at a time: each measured alone
        figures[name] = await timed_stop(service)
    shown = (f"{name} exit {status} after {seconds:.3f} s" for name, (status, seconds) in figures.items())
    print("SHUTDOWN distributed, idle: " + ", ".join(shown))
    for name, (status, seconds) in figures.items():
        assert status == 0, f"{name}:\n{running[name].tail()}"
        assert seconds < IDLE_EXIT_SECONDS, f"{name} took {seconds:.2f} s:\n{running[name].tail()}"


@pytest.mark.integration
async def test_a_slow_drain_logs_what_it_waits_for(services: Services) -> None:
    """The gateway waits, up to its decision timeout, for the decision of a write in flight; no
    scheduler runs, so it waits the whole timeout, and says so while it waits."""
    port = free_port()
    gateway = services.gateway(port)
    await gateway.start()
    await until_ready(port, gateway)
    batch = batch_client(f"http://127.0.0.1:{port}")
    write = asyncio.ensure_future(asyncio.to_thread(batch.create_scheduling_policy, name="p"))
    try:
        deadline = time.monotonic() + 10
        while not await asyncio.to_thread(policies, port):  # shown pending while it waits
            assert time.monotonic() < deadline, "the write did not reach the gateway"
            await asyncio.sleep(0.05)  # polling interval
        status, seconds = await timed_stop(gateway)
    finally:
        await write
        batch.close()
    log = gateway.tail(20_000)
    print(f"SHUTDOWN gateway with a write in flight: exit {status} after {seconds:.3f} s")
    assert status == 0, log
    assert "still stopping after" in log and "KafkaCommandPort.send" in log, log
    assert seconds < 5.0 + IDLE_EXIT_SECONDS, log  # the decision timeout, then at once


def policies(port: int) -> list[str]:
    reader = batch_client(f"http://127.0.0.1:{port}")
    try:
        return [policy["arn"] for policy in reader.list_scheduling_policies()["schedulingPolicies"]]
    finally:
        reader.close()
