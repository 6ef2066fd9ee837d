"""The embedded stack as a whole: local simulated agents and ``gpuquota up`` (embedded-only).

These start an ``EmbeddedStack`` (or ``gpuquota up`` without ``--kafka``) themselves: they test the
embedded process (agents wired to the shell, the SQLite data dir), not the API contract. Their
distributed counterparts need a process per service and a slower start, so they live in
tests/pipeline (test_services.py::test_gpuquota_up_distributed_mode, test_end_to_end.py). The restart
from the log runs in both modes in test_jobs.py::test_restart_continues_from_the_log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.gateway.conftest import StackThread, wait_for
from tests.gateway.helpers import G5, create_queue, create_share, payload, status, submit


def test_simulated_local_agent_runs_jobs_to_completion(tmp_path: Path) -> None:
    stack = StackThread(data_dir=tmp_path, nodes=f"{G5}=2", runtime="simulated", tick_seconds=0.05)
    try:
        batch = stack.client
        batch.create_scheduling_policy(name="p", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
        batch.create_service_environment(
            serviceEnvironmentName="se",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 2}],
        )
        batch.create_job_queue(
            jobQueueName="jq",
            priority=1,
            schedulingPolicyArn="p",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
        )
        create_share(batch, "QS1", "LEND_AND_BORROW", limit=2)
        body: dict[str, Any] = {
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
            "Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": "0.1"},
        }
        ok = submit(batch, "ok", serviceRequestPayload=json.dumps(body))
        body["Environment"]["GPUQUOTA_SIM_EXIT_CODE"] = "3"
        bad = submit(batch, "bad", serviceRequestPayload=json.dumps(body))
        wait_for(lambda: status(batch, ok) == "SUCCEEDED" and status(batch, bad) == "FAILED")
        failed = batch.describe_service_job(jobId=bad)
        assert "3" in failed["statusReason"]
        assert failed["attempts"][0]["stoppedAt"] >= failed["attempts"][0]["startedAt"]
    finally:
        stack.close()


def test_two_nodes_of_one_instance_type_run_a_two_instance_job(tmp_path: Path) -> None:
    """``--nodes ml.g5.xlarge=1x2``: two local nodes of one slot each; a job of two instances spans both."""
    stack = StackThread(data_dir=tmp_path, nodes=f"{G5}=1x2", runtime="simulated", tick_seconds=0.05)
    try:
        wait_for(
            lambda: sorted(n.node_id for n in stack.state.nodes.values() if n.online)
            == ["local-1", "local-2"]
        )
        assert [len(stack.state.nodes[n].slots) for n in ("local-1", "local-2")] == [1, 1]
        create_queue(stack.client, capacity=2)
        create_share(stack.client, "QS1", "RESERVE", limit=2)
        job = submit(stack.client, "pair", "QS1", serviceRequestPayload=payload(count=2))
        wait_for(lambda: status(stack.client, job) == "RUNNING")
        placed = [p.node_id for p in stack.state.jobs[job].placements]
        assert sorted(placed) == ["local-1", "local-2"]
    finally:
        stack.close()


def test_gpuquota_up_starts_serves_and_stops(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL")}
    env["GPUQUOTA_PORT"] = "0"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuquota", "up", "--data-dir", str(tmp_path), "--runtime", "simulated"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # start-up time is a benchmark's matter, not a test's
        assert line.startswith("gpuquota ready on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert (tmp_path / "events.sqlite3").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_gpuquota_up_distributed_mode_needs_kafka_and_database() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL")}
    proc = subprocess.run(
        [sys.executable, "-m", "gpuquota", "up", "--kafka", "localhost:9092"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert proc.returncode == 2 and "needs both --kafka and --database-url" in proc.stderr
