"""SageMaker jobs in real containers through the gateway (embedded stack, ``--runtime container``):
boto3 and the SageMaker Python SDK submit, the image runs, a reclaim preempts and the job resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.node_agent.container import ContainerEngine
from tests.containers import build_trainer_image, find_engine, remove_job_containers
from tests.gateway.conftest import StackThread, batch_client, wait_for
from tests.gateway.helpers import G5, status, submit, worked_example
from tests.gateway.test_sagemaker_sdk import use_gateway

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def engine() -> ContainerEngine:
    return find_engine()


@pytest.fixture(scope="module")
def image(engine: ContainerEngine) -> str:
    return build_trainer_image(engine)


@pytest.fixture
def stack(tmp_path: Path, engine: ContainerEngine) -> Iterator[StackThread]:
    stack = StackThread(data_dir=tmp_path, nodes=f"{G5}=3", runtime="container", tick_seconds=0.05)
    try:
        worked_example(stack.client)
        yield stack
    finally:
        job_ids = list(stack.state.jobs)
        stack.close()  # the agents stop; their containers would run on
        for job_id in job_ids:
            remove_job_containers(engine, job_id)


def sagemaker_payload(image: str, hyperparameters: dict[str, str], **extra: Any) -> str:
    return json.dumps(
        {
            "TrainingJobName": "t",
            "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
            "HyperParameters": hyperparameters,
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
            **extra,
        }
    )


def model_dirs(data_dir: Path, job_id: str) -> dict[int, Path]:
    """Attempt number -> that attempt's ``/opt/ml/model`` on the node."""
    found: dict[int, Path] = {}
    for env_file in data_dir.glob("nodes/*/attempts/*/algo-1/model/env"):
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        if env.get("GPUQUOTA_JOB_ID") == job_id:
            found[int(env["GPUQUOTA_ATTEMPT"])] = env_file.parent
    return found


def test_boto3_sagemaker_job_succeeds_and_a_failure_file_is_the_reason(
    stack: StackThread, image: str, tmp_path: Path
) -> None:
    data = tmp_path / "channel"
    data.mkdir()
    (data / "rows.csv").write_text("a,b\n")
    channel = {"ChannelName": "training", "DataSource": {"S3DataSource": {"S3Uri": f"file://{data}"}}}
    body = sagemaker_payload(
        image,
        {"steps": "2", "sleep": "0.05", "epochs": "3"},
        InputDataConfig=[channel],
        CheckpointConfig={"S3Uri": "s3://bucket/ckpt"},
    )
    ok = submit(stack.client, "ok", serviceRequestPayload=body)
    bad = submit(
        stack.client, "bad", serviceRequestPayload=sagemaker_payload(image, {"fail": "Bad label in row 7"})
    )
    wait_for(lambda: status(stack.client, ok) in ("SUCCEEDED", "FAILED"), TIMEOUT)
    described = stack.client.describe_service_job(jobId=ok)
    assert described["status"] == "SUCCEEDED", described.get("statusReason")
    model = model_dirs(tmp_path, ok)[1]
    assert (model / "done").exists() and (model / "channel-training").read_text() == "a,b\n"
    assert json.loads((model / "hyperparameters.json").read_text())["epochs"] == "3"
    assert "SM_HP_EPOCHS=3" in (model / "env").read_text()
    assert "SM_CHANNEL_TRAINING=/opt/ml/input/data/training" in (model / "env").read_text()
    wait_for(lambda: status(stack.client, bad) == "FAILED", TIMEOUT)
    assert stack.client.describe_service_job(jobId=bad)["statusReason"] == algorithm_error(
        "Bad label in row 7"
    )


def test_reclaim_preempts_a_container_which_checkpoints_and_resumes(
    stack: StackThread, image: str, tmp_path: Path
) -> None:
    batch = stack.client
    long = sagemaker_payload(image, {"steps": "100", "sleep": "0.1"})  # ends long after the reclaim
    first = submit(batch, "first", priority=2, serviceRequestPayload=long)
    borrower = submit(batch, "borrower", priority=1, serviceRequestPayload=long)  # on QS2's idle instance
    wait_for(lambda: all(status(batch, j) == "RUNNING" for j in (first, borrower)), TIMEOUT)
    step = tmp_path / "nodes" / "local-1" / "checkpoints" / borrower / "step"
    wait_for(lambda: step.exists() and int(step.read_text() or 0) >= 3, TIMEOUT)

    owner = submit(
        batch, "owner", share="QS2", serviceRequestPayload=sagemaker_payload(image, {"steps": "2"})
    )
    wait_for(lambda: status(batch, owner) == "SUCCEEDED", TIMEOUT)  # QS2 reclaimed its instance
    wait_for(lambda: status(batch, borrower) == "SUCCEEDED", TIMEOUT)
    attempts = batch.describe_service_job(jobId=borrower)["attempts"]
    assert len(attempts) == 2
    events = (step.parent / "events").read_text()
    assert events.startswith("sigterm at step"), "SIGTERM reached the container, which checkpointed"
    saved = int(events.split()[-1])
    assert int((model_dirs(tmp_path, borrower)[2] / "resumed_from").read_text()) == saved >= 3

    # the preempted container was gone before the owner's attempt started on the slot
    trace = stack.stack.agents["local-1"].trace
    gone = max(
        t for t, _, what in trace if what.startswith("container gpuquota-local-1-") and borrower in what
    )
    started = min(t for t, aid, what in trace if what == "report STARTING" and owner in aid)
    assert gone <= started


def test_sagemaker_sdk_model_trainer_job_runs_its_image(
    stack: StackThread, image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdk = use_gateway(monkeypatch, stack.url)
    configs = pytest.importorskip("sagemaker.train.configs")
    model_trainer = pytest.importorskip("sagemaker.train.model_trainer")
    trainer = model_trainer.ModelTrainer(
        training_image=image,
        role="arn:aws:iam::000000000000:role/training",
        compute=configs.Compute(instance_type=G5, instance_count=1),
        base_job_name="sdk",
        hyperparameters={"steps": 2, "sleep": 0.05},
        output_data_config=configs.OutputDataConfig(s3_output_path="s3://bucket/output"),
    )
    queued = sdk.TrainingQueue("jq").submit(trainer, None, job_name="sdk-job", quota_share_name="QS1")
    job_id = queued.job_arn.rsplit("/", 1)[1]
    wait_for(lambda: queued.describe()["status"] in ("SUCCEEDED", "FAILED"), TIMEOUT)
    described = queued.describe()
    assert described["status"] == "SUCCEEDED", described.get("statusReason")
    model = model_dirs(tmp_path, job_id)[1]
    assert (model / "done").read_text().strip() == "2"
    assert json.loads((model / "hyperparameters.json").read_text())["steps"] == "2"


def start_up(data_dir: Path) -> tuple[subprocess.Popen[str], Any]:
    """``gpuquota up --runtime container`` in its own process; returns it and a boto3 client."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL")}
    env["GPUQUOTA_PORT"] = "0"
    argv = ["up", "--data-dir", str(data_dir), "--runtime", "container", "--nodes", f"{G5}=3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuquota", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("gpuquota ready on "), line
    return proc, batch_client(line.rsplit(" ", 1)[1])


def test_gpuquota_up_killed_and_restarted_adopts_its_running_container(
    engine: ContainerEngine, image: str, tmp_path: Path
) -> None:
    procs: list[subprocess.Popen[str]] = []
    job = ""
    try:
        proc, batch = start_up(tmp_path)
        procs.append(proc)
        worked_example(batch)
        job = submit(
            batch, "survivor", serviceRequestPayload=sagemaker_payload(image, {"steps": "40", "sleep": "0.1"})
        )
        step = tmp_path / "nodes" / "local-1" / "checkpoints" / job / "step"
        wait_for(lambda: step.exists() and int(step.read_text() or 0) >= 2, TIMEOUT)
        proc.kill()  # SIGKILL: no clean-up of any kind
        proc.wait(30)
        assert len(set(engine_names(engine, job))) == 1, "the container outlives its agent"

        proc, batch = start_up(tmp_path)
        procs.append(proc)
        wait_for(lambda: status(batch, job) in ("SUCCEEDED", "FAILED"), TIMEOUT)
        described = batch.describe_service_job(jobId=job)
        assert described["status"] == "SUCCEEDED", described.get("statusReason")
        assert len(described["attempts"]) == 1
        assert (step.parent / "starts").read_text().split() == ["algo-1"], "nothing ran twice"
        wait_for(lambda: not engine_names(engine, job), TIMEOUT)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
        if job:
            remove_job_containers(engine, job)


def engine_names(engine: ContainerEngine, job_id: str) -> list[str]:
    listed = subprocess.run(
        engine.argv("ps", "--all", "--format", "{{.Names}}", "--filter", f"label=gpuquota.job_id={job_id}"),
        capture_output=True,
        text=True,
    )
    return listed.stdout.split()
