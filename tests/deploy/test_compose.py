"""docker-compose.yml runs: ``deploy/local/compose.sh up`` (what ``make compose-up`` does) starts the
whole distributed system on podman from the locally built images; S8, the worked example, runs through
boto3 against its gateway; the scheduler's process is SIGKILLed and its restart policy brings it back
with nothing lost; ``compose.sh down`` leaves no container, network or volume behind.

The project has a name and ports of its own, so it runs beside a developer's ``make compose-up``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import batch_client, poll
from tests.gateway.helpers import status, submit, worked_example
from tests.pipeline.services import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "local" / "compose.sh"
# a job that runs until it is preempted or terminated, as a process inside its node agent's container
LONG_JOB = json.dumps(
    {
        "TrainingJobName": "sleep",
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
        "AlgorithmSpecification": {"ContainerEntrypoint": ["python", "-c", "import time; time.sleep(3600)"]},
    }
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        subprocess.run(["which", "podman"], capture_output=True).returncode != 0 and not os.environ.get("CI"),
        reason="podman is not installed (deploy/local/podman.sh install)",
    ),
]


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True).stdout.strip()


def leftovers(project: str) -> dict[str, str]:
    label = f"label=com.docker.compose.project={project}"
    return {
        kind: found
        for kind, found in (
            ("containers", podman("ps", "-aq", "--filter", label)),
            ("networks", podman("network", "ls", "-q", "--filter", label)),
            ("volumes", podman("volume", "ls", "-q", "--filter", label)),
        )
        if found
    }


class Project:
    def __init__(self, tmp_path: Path) -> None:
        self.name = f"gpuquota-test-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.env = {
            **os.environ,
            "COMPOSE_PROJECT_NAME": self.name,
            "COMPOSE_RUN_DIR": str(tmp_path / "compose"),
            "GPUQUOTA_COMPOSE_PORT": str(self.port),
            "GPUQUOTA_COMPOSE_KAFKA_PORT": str(free_port()),
            "GPUQUOTA_COMPOSE_POSTGRES_PORT": str(free_port()),
        }

    def run(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            ["bash", str(COMPOSE), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"compose.sh {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
        return done.stdout + done.stderr

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def inspect(self, service: str, template: str) -> str:
        return podman("inspect", "--format", template, self.container(service))


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    project = Project(tmp_path)
    try:
        project.run("up")
        yield project
    finally:
        project.run("down")
    assert not leftovers(project.name), f"compose.sh down left {leftovers(project.name)}"


def statuses(batch: Any, ids: dict[str, str]) -> dict[str, str]:
    return {name: status(batch, job_id) for name, job_id in ids.items()}


def until_statuses(batch: Any, ids: dict[str, str], want: dict[str, str], what: str) -> None:
    poll(lambda: statuses(batch, ids) == want, 90, f"{what}: {want} (now {statuses(batch, ids)})", 0.5)


def test_compose_runs_the_worked_example_and_survives_a_scheduler_kill(project: Project) -> None:
    batch = batch_client(f"http://127.0.0.1:{project.port}")
    worked_example(batch)
    ids = {name: submit(batch, name, "QS1", prio, serviceRequestPayload=LONG_JOB) for name, prio in
           (("qs1_job_high", 3), ("qs1_job_med", 2), ("qs1_job_low", 1))}  # fmt: skip
    step1 = {"qs1_job_high": "RUNNING", "qs1_job_med": "RUNNING", "qs1_job_low": "RUNNABLE"}
    until_statuses(batch, ids, step1, "S8 step 1")
    ids["qs2_job_1"] = submit(batch, "qs2_job_1", "QS2", 1, serviceRequestPayload=LONG_JOB)
    step2 = {**step1, "qs1_job_med": "RUNNABLE", "qs2_job_1": "RUNNING"}
    until_statuses(batch, ids, step2, "S8 step 2")
    assert (
        batch.describe_service_job(jobId=ids["qs1_job_med"])["preemptionSummary"]["preemptedAttemptCount"]
        == 1
    )
    batch.update_service_job(jobId=ids["qs1_job_low"], schedulingPriority=4)
    step3 = {**step2, "qs1_job_high": "RUNNABLE", "qs1_job_low": "RUNNING"}
    until_statuses(batch, ids, step3, "S8 step 3")
    before = {name: batch.describe_service_job(jobId=job_id) for name, job_id in ids.items()}

    # the scheduler's process dies as in a crash (podman kill would count as a stop and disable the
    # unless-stopped policy, as `docker kill` does): its restart policy brings it back
    restarts = int(project.inspect("scheduler", "{{.RestartCount}}"))
    os.kill(int(project.inspect("scheduler", "{{.State.Pid}}")), signal.SIGKILL)
    poll(
        lambda: int(project.inspect("scheduler", "{{.RestartCount}}")) > restarts
        and project.inspect("scheduler", "{{.State.Status}}") == "running",
        60, "the scheduler container to be restarted", 0.5,
    )  # fmt: skip

    # nothing lost: every job as it was, and the restarted scheduler decides again
    after = {name: batch.describe_service_job(jobId=job_id) for name, job_id in ids.items()}
    for name in ids:
        kept = (after[name]["status"], after[name].get("attempts"))
        assert kept == (before[name]["status"], before[name].get("attempts")), name
    batch.terminate_service_job(jobId=ids["qs1_job_low"], reason="done")
    until_statuses(
        batch, ids, {**step3, "qs1_job_low": "FAILED", "qs1_job_high": "RUNNING"}, "after the restart"
    )
