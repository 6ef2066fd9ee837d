"""Fidelity: replaying a recorded run's exported trace with its own configuration reproduces the run's
decisions (the same dispatch and preemption sequence, given the recorded durations).

The run: the embedded stack with the simulated runtime and the worked example's configuration (3 x
g5; QS1 borrows with in-share preemption, QS2 lends, QS3 reserves). Two QS1 jobs (one borrowing QS2's
idle instance), a QS2 job that reclaims it (cross-share preemption), a QS3 job on its reserved
instance, and an urgent QS1 job that preempts within QS1; the preempted jobs run again later. The
steps are seconds apart, so the order of decisions does not hang on the stack's latency.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuquota.adapters.sqlite_store import STORE_FILE, SqliteEventStore
from gpuquota.entrypoints.cli import main
from gpuquota.sim.config import load_configuration
from gpuquota.sim.engine import simulate
from gpuquota.sim.export import records
from gpuquota.sim.trace import read_trace
from gpuquota.wire import events as ev
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import payload, submit

CONFIG = Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml"
QUEUE = "my-sm-training-qm-jq"
DEADLINE = 60.0

pytestmark = pytest.mark.slow


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def recorded_decisions(data_dir: Path) -> list[tuple[str, str]]:
    """(dispatch | preempt, job name) in log order."""

    async def read() -> list[tuple[str, str]]:
        store = await SqliteEventStore.open(data_dir / STORE_FILE)
        names: dict[str, str] = {}
        out: list[tuple[str, str]] = []
        try:
            async for record in records(store, "default"):
                for event in record.events:
                    if isinstance(event, ev.JobAccepted):
                        names[event.job.job_id] = event.job.job_name
                    elif isinstance(event, ev.JobDispatched):
                        out.append(("dispatch", names[event.job_id]))
                    elif isinstance(event, ev.JobPreempted):
                        out.append(("preempt", names[event.job_id]))
        finally:
            await store.close()
        return out

    return asyncio.run(read())


def record_run(data_dir: Path) -> None:
    stack = StackThread(data_dir=data_dir, nodes="ml.g5.xlarge=3", runtime="simulated", tick_seconds=0.5)
    try:
        assert main(["apply", "-f", str(CONFIG), "--endpoint", stack.url]) == 0
        batch = stack.client

        def job(name: str, share: str, seconds: float, priority: int = 1) -> str:
            body = payload(Environment={"GPUQUOTA_SIM_DURATION_SECONDS": str(seconds)})
            return submit(batch, name, share, priority, jobQueue=QUEUE, serviceRequestPayload=body)

        def status(job_id: str) -> str:
            return str(batch.describe_service_job(jobId=job_id)["status"])

        a = job("a", "QS1", 6)
        time.sleep(0.3)  # the workload's own spacing, not a synchronisation
        b = job("b", "QS1", 6)
        wait_until(lambda: status(a) == status(b) == "RUNNING", "a and b to run")
        time.sleep(1.0)
        c = job("c", "QS2", 3)  # reclaims QS2's instance from b
        wait_until(lambda: status(c) == "RUNNING", "c to run")
        time.sleep(1.0)
        d = job("d", "QS3", 3)  # QS3's reserved instance
        time.sleep(1.0)
        e = job("e", "QS1", 2, priority=5)  # preempts a within QS1
        jobs = (a, b, c, d, e)
        wait_until(lambda: all(status(j) == "SUCCEEDED" for j in jobs), "every job to succeed")
    finally:
        stack.close()


def test_replaying_a_recorded_run_reproduces_its_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    record_run(data_dir)
    recorded = recorded_decisions(data_dir)
    assert ("preempt", "b") in recorded and ("preempt", "a") in recorded  # the run did what it meant to

    trace = tmp_path / "trace.jsonl"
    assert main(["trace", "export", "--data-dir", str(data_dir), "-o", str(trace)]) == 0
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [line["job_name"] for line in lines] == ["a", "b", "c", "d", "e"]
    assert all(line["duration"] >= 2 for line in lines)

    result = simulate(load_configuration(CONFIG), read_trace(trace), record_decisions=True)
    assert result.decisions is not None
    names = {f"j{i}": line["job_name"] for i, line in enumerate(lines)}
    simulated = [(kind, names[job_id]) for kind, job_id in result.decisions]
    assert simulated == recorded
    assert sum(c.finished for c in result.counters) == 5
    assert sum(c.preemptions for c in result.counters) == 2
