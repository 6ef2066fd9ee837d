"""The seed's own SageMaker SDK code (``tests/data/blog_sdk.py``), run through ``eval "$(gpuquota env)"``
against an embedded stack (simulated runtime) and the project's real S3 server (S3Proxy,
``deploy/local/s3.sh``): the blog's ``ModelTrainer`` without a role or output path builds (STS, IAM),
its ``sm_drivers`` channel is uploaded to the default bucket, and the four jobs reach the blog's states
in the blog's order (issue #31).

The gateway is told S3Proxy's endpoint and key pair as ``gpuquota up --s3 local`` tells it, so
``gpuquota env`` alone sets up both. The same script with the jobs running the SDK's drivers in
containers, and their ``model.tar.gz`` in S3: ``tests/gateway/test_blog_sdk_container.py``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import StackThread

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "sagemaker-us-east-1-000000000000"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "S3_RUN_DIR": str(tmp_path / "s3"), "S3_BUCKETS": BUCKET}
    script = str(ROOT / "deploy/local/s3.sh")
    started = subprocess.run(["bash", script, "start"], env=env, capture_output=True, text=True, timeout=300)
    if started.returncode != 0:
        pytest.skip(f"no S3 server (deploy/local/s3.sh start): {started.stderr.strip()[-300:]}")
    try:
        yield env
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=60)


def test_the_blogs_sdk_code(s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sagemaker.train.aws_batch.training_queue")
    endpoint = (Path(s3["S3_RUN_DIR"]) / "endpoint").read_text().strip()
    monkeypatch.chdir(tmp_path)  # the node agents' work directories (.gpuquota/nodes)
    stack = StackThread(nodes="ml.g5.xlarge=3", runtime="simulated", tick_seconds=1)
    try:
        stack.gateway.s3_endpoint = endpoint
        secret = (Path(s3["S3_RUN_DIR"]) / "secret").read_text().strip()
        stack.gateway.s3_client_key = ("gpuquota-local", secret)  # s3.sh's default access key id
        env = {k: v for k, v in s3.items() if not k.startswith(("AWS_", "SAGEMAKER_"))}
        env |= {"XDG_CONFIG_HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
        script = (
            f"gpuquota apply --endpoint {stack.url} -f deploy/examples/worked-example.yaml >/dev/null && "
            f'eval "$(gpuquota env --endpoint {stack.url})" && python tests/data/blog_sdk.py'
        )
        ran = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        steps = [
            ast.literal_eval(line.split("states:", 1)[1].strip())
            for line in ran.stdout.splitlines()
            if line.strip().startswith("states:")
        ]
        dispatched = {"SCHEDULED", "STARTING", "RUNNING"}
        assert len(steps) == 3, ran.stdout  # the blog's three steps, in its order
        assert {steps[0]["qs1_job_high"], steps[0]["qs1_job_med"]} <= dispatched
        assert steps[1]["qs2_job_1"] in dispatched and steps[1]["qs1_job_med"] == "RUNNABLE"
        assert steps[2]["qs1_job_low"] in dispatched and steps[2]["qs1_job_high"] == "RUNNABLE"
        assert "Using validated caller role:\narn:aws:iam::000000000000:role/gpuquota" in ran.stderr
        uploaded = [line for line in ran.stdout.splitlines() if line.startswith("objects uploaded")]
        assert uploaded and int(uploaded[0].rsplit(":", 1)[1]) > 0, ran.stdout
    finally:
        stack.close()
