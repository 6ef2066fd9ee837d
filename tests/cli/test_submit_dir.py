"""``jobs submit -- CMD`` runs where it was submitted from (as ``sbatch`` does), and ``--image`` (I9).

The stack runs real ``process`` node agents, as ``gpuquota up`` does: the command's output, read back
with ``jobs logs``, says where it ran.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.ctl.api import poll
from tests.cli.conftest import Cli
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import status, worked_example

G5 = "ml.g5.xlarge"
TRAIN = (
    "import os\nprint('ran in', os.getcwd())\nprint('submitted from', os.environ['GPUQUOTA_SUBMIT_DIR'])\n"
)


def submit_argv(*extra: str) -> list[str]:
    return ["jobs", "submit", "--queue", "jq", "--share", "QS1", "--unit", G5, *extra]


@pytest.fixture
def real_stack(tmp_path: Path) -> Iterator[StackThread]:
    s = StackThread(data_dir=tmp_path / "data", nodes=f"{G5}=2", runtime="process", tick_seconds=0.2)
    try:
        yield s
    finally:
        s.close()


def _finished_log(cli: Cli, stack: StackThread, job_id: str) -> str:
    done = poll(
        lambda: status(stack.client, job_id) in ("SUCCEEDED", "FAILED") or None, time.monotonic() + 30
    )
    assert done, status(stack.client, job_id)
    logs = cli("jobs", "logs", job_id)
    assert logs.rc == 0, logs.err
    return logs.out


def test_a_command_runs_in_the_directory_it_was_submitted_from(
    real_stack: StackThread,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli = Cli(capsys, real_stack.url)
    worked_example(real_stack.client)
    here = tmp_path / "project"
    here.mkdir()
    (here / "train.py").write_text(TRAIN)
    monkeypatch.chdir(here)
    submitted = cli(*submit_argv("--", "python3", "train.py"))
    assert submitted.rc == 0, submitted.err
    assert submitted.err == f"gpuquota jobs submit: runs in {here} (its node is on this machine: local-1)\n"
    job_id = submitted.out.strip()
    assert _finished_log(cli, real_stack, job_id) == f"ran in {here}\nsubmitted from {here}\n"
    assert status(real_stack.client, job_id) == "SUCCEEDED"


def test_a_submit_dir_missing_on_the_node_runs_in_the_attempt_directory(
    real_stack: StackThread, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A payload submitted from another machine: its directory is not here, so the attempt's own
    directory, and the log says so first."""
    cli = Cli(capsys, real_stack.url)
    worked_example(real_stack.client)
    missing = tmp_path / "elsewhere"
    payload = {
        "AlgorithmSpecification": {"ContainerEntrypoint": ["python3", "-c", "import os; print(os.getcwd())"]},
        "ResourceConfig": {"InstanceType": G5},
        "Environment": {"GPUQUOTA_SUBMIT_DIR": str(missing)},
    }
    file = tmp_path / "job.json"
    file.write_text(json.dumps(payload))
    submitted = cli(*submit_argv("-f", str(file)))
    assert (submitted.rc, submitted.err) == (0, "")
    first, ran_in, *rest = _finished_log(cli, real_stack, submitted.out.strip()).splitlines()
    attempt_dir = Path(ran_in)
    assert attempt_dir.name == "algo-1" and attempt_dir.parent.parent.name == "attempts"
    assert attempt_dir.is_relative_to(tmp_path / "data" / "nodes" / "local-1")
    assert (
        first
        == f"gpuquota: GPUQUOTA_SUBMIT_DIR {missing} does not exist on node local-1: running in {ran_in}"
    )
    assert rest == []


def test_image_sets_the_training_image(stack: StackThread, cli: Cli, tmp_path: Path) -> None:
    batch: Any = stack.client
    worked_example(batch)
    with_command = cli(*submit_argv("--image", "localhost/train:1", "--", "python3", "train.py"))
    assert with_command.rc == 0, with_command.err
    assert with_command.err == ""  # a container runs in its image's working directory: nothing to say
    job = batch.describe_service_job(jobId=with_command.out.strip())
    algorithm = json.loads(job["serviceRequestPayload"])["AlgorithmSpecification"]
    assert algorithm == {
        "TrainingInputMode": "File",
        "TrainingImage": "localhost/train:1",
        "ContainerEntrypoint": ["python3", "train.py"],
    }
    image_only = cli(*submit_argv("--image", "registry.example/team/trainer:2"))
    assert image_only.rc == 0, image_only.err
    job = batch.describe_service_job(jobId=image_only.out.strip())
    assert job["jobName"] == "trainer"
    assert "ContainerEntrypoint" not in json.loads(job["serviceRequestPayload"])["AlgorithmSpecification"]
    file = tmp_path / "job.json"
    file.write_text(json.dumps({"TrainingJobName": "f", "AlgorithmSpecification": {"TrainingImage": "old"}}))
    from_file = cli(*submit_argv("-f", str(file), "--image", "new"))
    assert from_file.rc == 0, from_file.err
    payload = json.loads(batch.describe_service_job(jobId=from_file.out.strip())["serviceRequestPayload"])
    assert payload["AlgorithmSpecification"]["TrainingImage"] == "new"
    assert payload["Environment"] == {"GPUQUOTA_SUBMIT_DIR": str(Path.cwd())}
    both = cli(*submit_argv("-f", str(file), "--", "true"))
    assert both.rc == 2 and "give either -f PAYLOAD.json or -- CMD" in both.err
