"""The container runtime's images with real podman: the node's image map (``GPUQUOTA_IMAGE_MAP``) runs
a local image for the blog's ECR address, and an image that cannot be pulled (nothing can be here)
fails its attempt at once with AWS's ``CannotPullContainerError: ...``, shown by describe and by
``gpuquota explain`` (issue #31)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.config.image_map import ImageMap
from gpuquota.node_agent.container import ContainerEngine
from tests.containers import build_trainer_image, find_engine, remove_job_containers
from tests.gateway.conftest import StackThread, wait_for
from tests.gateway.helpers import status, submit, worked_example
from tests.gateway.test_container_jobs import sagemaker_payload

pytestmark = pytest.mark.slow
ECR = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training"
TIMEOUT = 90.0  # a loaded machine starts containers slowly


@pytest.fixture(scope="module")
def engine() -> ContainerEngine:
    return find_engine()


@pytest.fixture
def stack(engine: ContainerEngine, tmp_path: Path) -> Iterator[StackThread]:
    image = build_trainer_image(engine)
    options = {"nodes": "ml.g5.xlarge=3", "tick_seconds": 1, "data_dir": tmp_path}
    stack = StackThread(runtime="container", image_map=f"{ECR}={image}", **options)
    worked_example(stack.client)
    yield stack
    stack.close()


def test_a_mapped_image_runs_and_an_unpullable_one_fails_with_awss_reason(
    stack: StackThread, engine: ContainerEngine
) -> None:
    mapped = submit(
        stack.client, "mapped", serviceRequestPayload=sagemaker_payload(f"{ECR}:2.5-gpu-py311", {})
    )
    missing = "registry.invalid/nobody/trainer:1"
    started = time.monotonic()
    try:
        wait_for(lambda: status(stack.client, mapped) in ("SUCCEEDED", "FAILED"), TIMEOUT)
        described = stack.client.describe_service_job(jobId=mapped)
        assert described["status"] == "SUCCEEDED", described.get("statusReason")
        failed = submit(stack.client, "unpullable", serviceRequestPayload=sagemaker_payload(missing, {}))
        wait_for(lambda: status(stack.client, failed) in ("SUCCEEDED", "FAILED"), TIMEOUT)
        took = time.monotonic() - started
        described = stack.client.describe_service_job(jobId=failed)
        reason = described.get("statusReason") or ""
        assert described["status"] == "FAILED" and "CannotPullContainerError: " in reason, reason
        assert missing in reason and took < TIMEOUT
        explained = subprocess.run(
            [sys.executable, "-m", "gpuquota", "explain", failed, "--endpoint", stack.url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "CannotPullContainerError" in explained, explained
    finally:
        remove_job_containers(engine, mapped)


def test_the_image_map_reads_pairs_and_json_and_maps_whole_references_then_repositories() -> None:
    pairs = ImageMap.parse(f"{ECR}=localhost/py:dev, {ECR}:2.5-gpu=localhost/old:1")
    assert pairs.resolve(f"{ECR}:2.5-gpu") == "localhost/old:1"  # the whole reference first
    assert pairs.resolve(f"{ECR}:2.6-gpu") == "localhost/py:dev"  # then its repository, any tag
    assert pairs.resolve(f"{ECR}@sha256:abc") == "localhost/py:dev"
    assert pairs.resolve("localhost:5000/x:1") == "localhost:5000/x:1"  # not named: as given
    assert ImageMap.parse('{"a:1": "b:2"}').resolve("a:1") == "b:2"
    assert ImageMap.parse("").resolve("a") == "a"
    for bad in ("a", "a=", "{not json", '{"a": 1}', "a=b=c"):
        with pytest.raises(ValueError):
            ImageMap.parse(bad)
