"""S8, the worked example, through unmodified boto3, with node agents running real processes.

Each job is ``trainer.py``: it checkpoints a step counter until SIGTERM (saving the checkpoint) or until
the test tells it to finish. After each step the statuses are checked; a preempted job's process must
be gone (the agent reports it stopped only then) and, rescheduled, its next attempt must resume from
the checkpoint the preempted one saved. Beyond S8's three steps the jobs are finished one by one, so
both preempted jobs run again. Same test in the embedded mode and the distributed mode (Kafka and
PostgreSQL; the agent runs in the stack's process and talks to the scheduler over Kafka).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuquota.node_agent import procs
from gpuquota.testing import GpuquotaStack, StackOptions, start_stack
from tests.e2e.conftest import Jobs
from tests.gateway.helpers import status, submit, worked_example


def statuses(batch: Any, jobs: dict[str, str]) -> dict[str, str]:
    return {name: status(batch, job_id) for name, job_id in jobs.items()}


def running(stack: GpuquotaStack, jobs: Jobs, ids: dict[str, str], name: str, attempt: int) -> int:
    """Wait until ``name`` is RUNNING with its ``attempt``-th process started; return its pid."""
    stack.wait_for_status(ids[name], "RUNNING", timeout=60)
    started = jobs.started(name, attempt)
    assert procs.pid_alive(started["pid"])
    return int(started["pid"])


def preempted(stack: GpuquotaStack, jobs: Jobs, ids: dict[str, str], name: str, pid: int) -> dict[str, Any]:
    """Wait until ``name`` is back to RUNNABLE: its process got SIGTERM, saved its checkpoint, is gone."""
    job = stack.wait_for_status(ids[name], "RUNNABLE", timeout=60)
    assert not procs.pid_alive(pid), f"{name}'s process {pid} still runs after the job was requeued"
    term = jobs.marker(name, 1, "term")
    assert term is not None and term["step"] > 0, f"{name} did not checkpoint on SIGTERM"
    assert job["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert len(job["attempts"]) == 1
    return job


def resumed(stack: GpuquotaStack, jobs: Jobs, ids: dict[str, str], name: str) -> None:
    """``name`` runs again (attempt 2) from the checkpoint its preempted attempt saved."""
    running(stack, jobs, ids, name, 2)
    term = jobs.marker(name, 1, "term")
    assert term is not None
    assert jobs.started(name, 2)["resumed_from"] == term["step"]


@pytest.mark.parametrize("mode", ["embedded", pytest.param("distributed", marks=pytest.mark.integration)])
def test_worked_example_with_real_processes(
    mode: str, request: pytest.FixtureRequest, jobs: Jobs, tmp_path: Path
) -> None:
    kafka = database_url = None
    if mode == "distributed":
        kafka = request.getfixturevalue("kafka_bootstrap")
        database_url = request.getfixturevalue("database_url")
    options = StackOptions(
        mode="distributed" if mode == "distributed" else "embedded",
        nodes="ml.g5.xlarge=3",
        runtime="process",
        kafka=kafka,
        database_url=database_url,
    )
    with start_stack(options, tmp_path / "stack") as stack:
        play(stack, jobs)


def play(stack: GpuquotaStack, jobs: Jobs) -> None:
    batch = stack.batch
    worked_example(batch)
    ids: dict[str, str] = {}

    def submit_job(name: str, share: str, priority: int) -> None:
        ids[name] = submit(batch, name, share, priority, serviceRequestPayload=jobs.trainer())

    # 1. high runs in quota, med borrows QS2's idle instance, low waits (QS3's instance is reserved).
    for name, priority in (("qs1_job_high", 3), ("qs1_job_med", 2), ("qs1_job_low", 1)):
        submit_job(name, "QS1", priority)
    high_pid = running(stack, jobs, ids, "qs1_job_high", 1)
    med_pid = running(stack, jobs, ids, "qs1_job_med", 1)
    assert statuses(batch, ids) == {
        "qs1_job_high": "RUNNING",
        "qs1_job_med": "RUNNING",
        "qs1_job_low": "RUNNABLE",
    }
    assert jobs.starts("qs1_job_low") == []

    # 2. qs2_job_1 reclaims QS2's instance: med is preempted (cross-share), its process stopped.
    submit_job("qs2_job_1", "QS2", 1)
    med = preempted(stack, jobs, ids, "qs1_job_med", med_pid)
    assert med["statusReason"].startswith("Preempted (cross-share)")
    running(stack, jobs, ids, "qs2_job_1", 1)
    assert statuses(batch, ids) == {
        "qs1_job_high": "RUNNING",
        "qs1_job_med": "RUNNABLE",
        "qs1_job_low": "RUNNABLE",
        "qs2_job_1": "RUNNING",
    }
    assert procs.pid_alive(high_pid)

    # 3. low raised to 4: in-share preemption stops high; low runs; med stays RUNNABLE.
    batch.update_service_job(jobId=ids["qs1_job_low"], schedulingPriority=4)
    high = preempted(stack, jobs, ids, "qs1_job_high", high_pid)
    low = ids["qs1_job_low"]
    assert high["statusReason"] == f"Preempted (in-share): higher priority job {low} (priority 4 > 3)"
    running(stack, jobs, ids, "qs1_job_low", 1)
    assert statuses(batch, ids) == {
        "qs1_job_high": "RUNNABLE",
        "qs1_job_med": "RUNNABLE",
        "qs1_job_low": "RUNNING",
        "qs2_job_1": "RUNNING",
    }

    # 4. low finishes: QS1's instance goes to high, which resumes from its checkpoint.
    jobs.finish("qs1_job_low")
    stack.wait_for_status(low, "SUCCEEDED", timeout=60)
    resumed(stack, jobs, ids, "qs1_job_high")
    assert status(batch, ids["qs1_job_med"]) == "RUNNABLE"  # QS2's instance is busy, QS3's reserved

    # 5. qs2_job_1 finishes: med borrows QS2's instance again and resumes from its checkpoint.
    jobs.finish("qs2_job_1")
    stack.wait_for_status(ids["qs2_job_1"], "SUCCEEDED", timeout=60)
    resumed(stack, jobs, ids, "qs1_job_med")

    # 6. Everything finishes; each job ran as many processes as it had attempts.
    jobs.finish("qs1_job_high")
    jobs.finish("qs1_job_med")
    for name, job_id in ids.items():
        job = stack.wait_for_status(job_id, "SUCCEEDED", timeout=60)
        assert jobs.starts(name) == list(range(1, len(job["attempts"]) + 1))
    assert {name: len(jobs.starts(name)) for name in ids} == {
        "qs1_job_high": 2,
        "qs1_job_med": 2,
        "qs1_job_low": 1,
        "qs2_job_1": 1,
    }
    assert not any(procs.pid_alive(pid) for pid in jobs.pids())
