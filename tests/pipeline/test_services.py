"""``gpuquota gateway``, ``gpuquota scheduler`` and ``gpuquota node-agent`` as separate processes,
configured only by ``GPUQUOTA_*`` variables, against the real broker and database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.kafka import KafkaTopics
from tests.gateway.helpers import payload, status, submit, worked_example
from tests.pipeline.conftest import wait_until
from tests.pipeline.services import ServiceProcess, Services, batch_client, free_port

pytestmark = pytest.mark.integration


async def run_one_job(batch: Any, share: str) -> None:
    """Set up the worked example through ``batch``, then run one short simulated job in ``share``."""
    await asyncio.to_thread(worked_example, batch)
    sim = payload(Environment={"GPUQUOTA_SIM_DURATION_SECONDS": "0.2"})
    job_id = await asyncio.to_thread(submit, batch, "train", share, serviceRequestPayload=sim)

    async def succeeded() -> bool:
        return await asyncio.to_thread(status, batch, job_id) == "SUCCEEDED"

    await wait_until(succeeded, 30, "the job to succeed")


async def test_three_services_run_a_job_to_success(services: Services, run_id: str) -> None:
    port = free_port()
    running = [services.scheduler(), services.gateway(port), services.node_agent(f"node-{run_id}")]
    await asyncio.gather(*(service.start() for service in running))
    batch = batch_client(f"http://127.0.0.1:{port}")
    await run_one_job(batch, "QS2")
    assert all(service.alive for service in running)
    assert [await service.stop() for service in running] == [0, 0, 0]


async def test_gpuquota_up_distributed_mode(
    kafka_bootstrap: str, database_url: str, topics: KafkaTopics, pool: str, tmp_path: Path
) -> None:
    port = free_port()
    up = ServiceProcess(
        "up",
        {"GPUQUOTA_TOPIC_PREFIX": topics.prefix, "GPUQUOTA_POOL": pool},
        tmp_path / "up.log",
        args=[
            "--kafka", kafka_bootstrap, "--database-url", database_url, "--port", str(port),
            "--runtime", "simulated", "--data-dir", str(tmp_path / "data"),
        ],
    )  # fmt: skip
    try:
        await up.start()
        assert up.ready_line == f"gpuquota ready on http://127.0.0.1:{port}"
        batch = batch_client(f"http://127.0.0.1:{port}")
        await run_one_job(batch, "QS1")
        assert await up.stop() == 0
    except BaseException:
        print(up.tail())
        raise
    finally:
        await up.kill()
