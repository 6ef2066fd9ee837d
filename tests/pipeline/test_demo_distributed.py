"""``gpuquota demo`` against the distributed mode: ``gpuquota up --kafka ... --database-url ...``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gpuquota.adapters.kafka import KafkaTopics
from tests.pipeline.recorded_schemas import check_recorded_messages
from tests.pipeline.services import ServiceProcess, free_port

pytestmark = pytest.mark.integration


async def test_demo_runs_the_worked_example_on_the_distributed_stack(
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
        demo = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuquota", "demo",
            "--endpoint", f"http://127.0.0.1:{port}", "--output-dir", str(tmp_path / "demo"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(demo.communicate(), timeout=180)
        text = out.decode()
        assert demo.returncode == 0, text
        assert "PASS  3/3 steps passed" in text
        assert (tmp_path / "demo" / "timeline.svg").is_file()
        assert await up.stop() == 0
        # the whole run's messages, on every topic, match schemas/ (issue #18)
        seen = await check_recorded_messages(kafka_bootstrap, topics)
        covered = {
            "SubmitJob",
            "UpdateJobPriority",
            "AttemptReport",
            "JobAccepted",
            "JobRequeued",
            "JobFailed",
        }
        assert covered | {"InputResult", "RunAttempt", "StopAttempt"} <= set(seen), seen
    except BaseException:
        print(up.tail())
        raise
    finally:
        await up.kill()
