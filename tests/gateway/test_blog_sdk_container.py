"""The seed's SageMaker SDK code (``tests/data/blog_sdk.py``, as the blog prints it) run for real: through
``eval "$(gpuquota env)"`` against ``gpuquota up --s3 local --runtime container`` with podman, the
blog's ECR PyTorch image mapped (``GPUQUOTA_IMAGE_MAP``) to the local SDK image of
``gpuquota.ctl.sdk_image`` (Debian's python3 and pip; it starts in ``START`` s, as an instance takes time
to start, so the blog's steps find its jobs running). The four jobs reach the blog's states in the blog's
order, every one then succeeds, its log says Hello World (the SDK's own ``sm_drivers`` ran
``SourceCode(command="echo 'Hello World'")``), and its ``model.tar.gz`` is in S3 where SageMaker puts
it: ``<S3OutputPath>/<TrainingJobName>/output/model.tar.gz`` (issue #31).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpuquota.ctl.api import CliError
from gpuquota.ctl.sdk_image import build_sdk_image, image_map
from gpuquota.node_agent.container import ContainerEngine
from tests.containers import find_engine, remove_job_containers

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
ROOT = Path(__file__).resolve().parents[2]
QUEUE = "my-sm-training-qm-jq"
JOBS = ("qs1_job_high", "qs1_job_med", "qs1_job_low", "qs2_job_1")
STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
START = 40
"""Seconds the SDK image's containers take to start: the blog's steps must find the jobs still running,
and on a loaded CI machine the SDK takes 10-20 s per submission (15 s failed there once)."""
FINISH = 360.0
"""Seconds for the four jobs to succeed once the blog's script is done (about 90 here)."""


@pytest.fixture(scope="module")
def engine() -> ContainerEngine:
    return find_engine()


@pytest.fixture(scope="module")
def image(engine: ContainerEngine) -> str:
    try:
        return build_sdk_image(engine.path, START)
    except CliError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def up(tmp_path: Path, image: str) -> Iterator[str]:
    """``gpuquota up --s3 local --runtime container``; yields its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUQUOTA_", "AWS_", "SAGEMAKER_"))}
    env |= {"GPUQUOTA_PORT": "0", "GPUQUOTA_IMAGE_MAP": image_map(image)}
    argv = ["up", "--data-dir", str(tmp_path / "up"), "--runtime", "container", "--s3", "local"]
    argv += ["--nodes", "ml.g5.xlarge=3", "--preemption-grace", "3"]
    errors = tmp_path / "up.err"
    with open(errors, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota", *argv],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip() for _ in range(2)]  # "s3 ready on ...", "gpuquota ready on ..."
    try:
        assert lines[1].startswith("gpuquota ready on "), (lines, errors.read_text()[-3000:])
        yield lines[1].rsplit(" ", 1)[1]
    finally:
        proc.terminate()  # stops its containers and S3Proxy
        proc.wait(90)
        proc.stdout.close()


def environment(url: str, config: Path) -> dict[str, str]:
    """What ``eval "$(gpuquota env)"`` exports."""
    printed = subprocess.run(
        [sys.executable, "-m", "gpuquota", "env", "--endpoint", url, "--config-dir", str(config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in printed.splitlines()
        if line.startswith("export ")
    )


def wait_succeeded(batch: Any, timeout: float) -> dict[str, dict[str, Any]]:
    """name -> DescribeServiceJob once all four jobs are final; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = {
            j["jobName"]: j
            for status in STATUSES
            for j in batch.list_service_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]
        }
        if set(jobs) >= set(JOBS) and all(j["status"] in ("SUCCEEDED", "FAILED") for j in jobs.values()):
            return {name: batch.describe_service_job(jobId=j["jobId"]) for name, j in jobs.items()}
        assert time.monotonic() < deadline, {n: j["status"] for n, j in jobs.items()}
        time.sleep(0.5)


def test_the_blogs_sdk_code_runs_in_containers(
    up: str, engine: ContainerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sagemaker.train.aws_batch.training_queue")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUQUOTA_", "AWS_", "SAGEMAKER_"))}
    env = clean | {"XDG_CONFIG_HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{clean['PATH']}"}
    script = (
        f"gpuquota apply --endpoint {up} -f deploy/examples/worked-example.yaml >/dev/null && "
        f'eval "$(gpuquota env --endpoint {up})" && python tests/data/blog_sdk.py'
    )
    ran = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    print(ran.stdout)  # the blog's states (pytest -s)
    steps = [
        ast.literal_eval(line.split("states:", 1)[1].strip())
        for line in ran.stdout.splitlines()
        if line.strip().startswith("states:")
    ]
    dispatched = {"SCHEDULED", "STARTING", "RUNNING"}  # not finished: the steps preempt running jobs
    assert len(steps) == 3, ran.stdout  # the blog's three steps, in its order
    assert {steps[0]["qs1_job_high"], steps[0]["qs1_job_med"]} <= dispatched, steps
    assert steps[1]["qs2_job_1"] in dispatched and steps[1]["qs1_job_med"] == "RUNNABLE", steps
    assert steps[2]["qs1_job_low"] in dispatched and steps[2]["qs1_job_high"] == "RUNNABLE", steps

    exported = environment(up, tmp_path / "gpuquota")
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    # boto3's default session, as a new process has it: one made by an earlier test of this pytest run
    # keeps that test's credentials, which this stack's S3 server refuses
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    batch, s3 = boto3.client("batch"), boto3.client("s3")  # the SDK's own clients' set-up
    described = wait_succeeded(batch, FINISH)
    try:
        for name in JOBS:
            job = described[name]
            assert job["status"] == "SUCCEEDED", (name, job.get("statusReason"))
            logs = subprocess.run(
                [sys.executable, "-m", "gpuquota", "jobs", "logs", job["jobId"], "--endpoint", up],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "\nHello World\n" in logs, (name, logs[-2000:])
            payload = json.loads(job["serviceRequestPayload"])
            bucket, _, prefix = (
                payload["OutputDataConfig"]["S3OutputPath"].removeprefix("s3://").partition("/")
            )
            key = f"{prefix.rstrip('/')}/{payload['TrainingJobName']}/output/model.tar.gz"
            s3.head_object(Bucket=bucket, Key=key)  # ClientError 404 if SageMaker's place is empty
            print(name, job["status"], f"s3://{bucket}/{key}")
    finally:
        for job in described.values():
            remove_job_containers(engine, job["jobId"])
