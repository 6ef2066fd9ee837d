"""Long-lived containers on the services' own event loop: a real ``gpuquota up --runtime container``
process (``observe.startup.run_loop``, uvloop's loop) runs trainers that would last 25 minutes, and
while they run: the job is RUNNING, its log can be followed, a reclaim and TerminateServiceJob stop its
container within the grace period, and its runtime limits (``attemptDurationSeconds``,
``MaxRuntimeInSeconds``) stop it.

Until engine calls ended at the command's exit (``node_agent.children.run``), ``podman run --detach``
returned on uvloop only when the container exited: every one of these waited for the end.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuquota.node_agent.container import LABEL, ContainerEngine
from tests.containers import build_trainer_image, find_engine, remove_job_containers
from tests.gateway.conftest import wait_for
from tests.gateway.helpers import status, submit, worked_example
from tests.gateway.test_container_jobs import sagemaker_payload, start_up

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
LONG = {"steps": "3000", "sleep": "0.5"}
"""25 minutes unless stopped, printing ``step N`` every half second."""
START = 30.0
"""From submission to RUNNING, on a loaded machine (about a second here)."""
GRACE = 30.0
"""``gpuquota up``'s preemption grace; the trainer checkpoints and exits at SIGTERM, well within it."""


@pytest.fixture(scope="module")
def engine() -> ContainerEngine:
    return find_engine()


@pytest.fixture(scope="module")
def image(engine: ContainerEngine) -> str:
    return build_trainer_image(engine)


@dataclass
class Up:
    """A ``gpuquota up --runtime container`` process with the worked example's queue and shares."""

    proc: subprocess.Popen[str]
    batch: Any
    data_dir: Path
    engine: ContainerEngine
    image: str
    jobs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.batch.meta.endpoint_url)

    def submit_long(self, name: str, share: str = "QS1", **extra: Any) -> str:
        """A 25-minute trainer (``stopping``: its StoppingCondition; ``timeoutConfig`` as given)."""
        stopping = extra.pop("stopping", {"MaxRuntimeInSeconds": 3600})
        body = sagemaker_payload(self.image, LONG, StoppingCondition=stopping)
        self.jobs.append(submit(self.batch, name, share, serviceRequestPayload=body, **extra))
        return self.jobs[-1]

    def running(self, job_id: str) -> list[str]:
        """The job's containers that run now (``podman ps``)."""
        return containers(self.engine, job_id, "--filter", "status=running")

    def wait_running(self, job_id: str) -> float:
        """Seconds until the job is RUNNING (its container running then); fails after :data:`START`."""
        started = time.monotonic()
        wait_for(lambda: status(self.batch, job_id) == "RUNNING", START, interval=0.1)
        took = time.monotonic() - started
        assert len(self.running(job_id)) == 1, "RUNNING while its container runs"
        return took

    def wait_gone(self, job_id: str) -> float:
        """Seconds until no container of the job is left (stopped and removed); fails after the grace."""
        started = time.monotonic()
        wait_for(lambda: not containers(self.engine, job_id), GRACE, interval=0.1)
        return time.monotonic() - started


def containers(engine: ContainerEngine, job_id: str, *filters: str) -> list[str]:
    argv = ["ps", "--all", "--format", "{{.Names}}", "--filter", f"label={LABEL}.job_id={job_id}", *filters]
    listed = subprocess.run(engine.argv(*argv), capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def on_uvloop(pid: int) -> bool:
    """The process has uvloop's loop loaded (``run_loop`` imports it only to run on it)."""
    return "/uvloop/loop." in Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture
def up(tmp_path: Path, engine: ContainerEngine, image: str) -> Iterator[Up]:
    proc, batch = start_up(tmp_path)
    stack = Up(proc, batch, tmp_path, engine, image)
    try:
        if sys.platform == "linux":
            assert on_uvloop(proc.pid), "gpuquota up runs on the services' loop, uvloop's"
        worked_example(batch)
        yield stack
    finally:
        proc.kill()  # its containers would run on: removed below
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        for job_id in stack.jobs:
            remove_job_containers(engine, job_id)


class Follower:
    """``gpuquota jobs logs JOB --follow -o json``: the chunks it prints, as they come."""

    def __init__(self, up: Up, job_id: str) -> None:
        argv = ["jobs", "logs", job_id, "--follow", "-o", "json", "--endpoint", up.url]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota", *argv], stdout=subprocess.PIPE, text=True
        )
        self.chunks: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.chunks.put(json.loads(line))

    def until(self, condition: Callable[[str], bool], timeout: float) -> str:
        """The text printed so far once ``condition`` holds for it; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not condition(text := "".join(c["text"] for c in self.seen)):
            left = deadline - time.monotonic()
            assert left > 0, f"condition not met within {timeout} s; the log so far: {text!r}"
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.chunks.get(timeout=left))
        return text

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_a_long_container_runs_its_log_follows_and_terminate_stops_it(up: Up) -> None:
    job = up.submit_long("long")
    to_running = up.wait_running(job)

    follower = Follower(up, job)
    try:
        text = follower.until(lambda text: "step 3\n" in text, START)
        assert text.startswith("step 1\nstep 2\nstep 3\n"), text
        printed = [c for c in follower.seen if c["text"]]
        assert printed and all(c["status"] == "RUNNING" for c in printed), "followed while it runs"
        assert up.running(job) and status(up.batch, job) == "RUNNING"

        up.batch.terminate_service_job(jobId=job, reason="no longer needed")
        gone = up.wait_gone(job)
        wait_for(lambda: status(up.batch, job) == "FAILED", START)
        assert follower.proc.wait(START) == 0, "--follow returns once the attempt has ended"
    finally:
        follower.close()
    described = up.batch.describe_service_job(jobId=job)
    assert described["statusReason"] == "no longer needed"
    print(f"\nsubmitted -> RUNNING {to_running:.1f} s; terminate -> container gone {gone:.1f} s")


def test_a_reclaim_stops_the_borrowing_container_within_the_grace(up: Up) -> None:
    first = up.submit_long("first", priority=2)
    borrower = up.submit_long("borrower", priority=1)  # on QS2's idle instance
    up.wait_running(first)
    up.wait_running(borrower)
    steps = lambda: list(up.data_dir.glob(f"nodes/*/checkpoints/{borrower}/step"))  # noqa: E731
    step = wait_for(steps, START)[0]
    wait_for(lambda: int(step.read_text() or 0) >= 2, START)

    owner = up.submit_long("owner", share="QS2")  # QS2 reclaims its instance
    gone = up.wait_gone(borrower)
    to_running = up.wait_running(owner)
    assert (step.parent / "events").read_text().startswith("sigterm at step"), "SIGTERM, then checkpoint"
    assert status(up.batch, borrower) == "RUNNABLE"
    assert up.running(first), "the job within its share runs on"
    print(f"\nreclaim -> borrower's container gone {gone:.1f} s; owner RUNNING after {to_running:.1f} s")


def test_the_attempt_timeout_and_max_runtime_stop_long_containers(up: Up) -> None:
    timed = up.submit_long("timed", timeoutConfig={"attemptDurationSeconds": 5})
    limited = up.submit_long("limited", stopping={"MaxRuntimeInSeconds": 5})
    up.wait_running(timed)
    up.wait_running(limited)
    started = time.monotonic()
    failed = lambda: all(status(up.batch, job) == "FAILED" for job in (timed, limited))  # noqa: E731
    wait_for(failed, 5 + GRACE + START, interval=0.1)
    for job in (timed, limited):
        up.wait_gone(job)
    took = time.monotonic() - started
    reasons = {job: up.batch.describe_service_job(jobId=job)["statusReason"] for job in (timed, limited)}
    assert reasons[timed] == "Attempt duration exceeded", reasons
    assert "MaxRuntimeInSeconds" in reasons[limited], reasons
    print(f"\n5 s limits -> both FAILED and their containers gone after {took:.1f} s: {reasons}")
