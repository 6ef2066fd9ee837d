"""``gpuquota demo --sdk``: the seed blog's three steps with the SageMaker SDK itself, on a real
``gpuquota up --runtime container --s3 local`` (podman, S3Proxy), and what it says when something is
missing."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuquota.ctl.demo_sdk import run_sdk_demo
from tests.containers import find_engine

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK's import shims


@pytest.mark.slow
def test_demo_sdk_plays_the_blog_with_the_sdk_and_shows_hello_world_and_the_models(tmp_path: Path) -> None:
    find_engine()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUQUOTA_", "AWS_", "SAGEMAKER_"))}
    env |= {"TMPDIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "gpuquota", "demo", "--sdk", "--step-timeout", "60"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "3/3 steps passed, every job said Hello World" in proc.stdout, proc.stdout
    for name in ("qs1_job_high", "qs1_job_med", "qs1_job_low", "qs2_job_1"):
        row = next(line for line in proc.stdout.splitlines() if line.split()[:2] == [name, "SUCCEEDED"])
        assert "Hello World" in row and "/output/model.tar.gz (" in row, row


def test_demo_sdk_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(endpoint="http://127.0.0.1:1", step_timeout=30.0)
    assert run_sdk_demo(args) == 1
    assert "--sdk starts its own stack" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "sagemaker.train.aws_batch.training_queue", None)  # not installed
    assert run_sdk_demo(argparse.Namespace(step_timeout=30.0)) == 1
    assert "pip install 'gpuquota[sdk]'" in capsys.readouterr().err
