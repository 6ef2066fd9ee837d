"""The pytest plugin gpuquota.testing: registration, options, modes, and the documented example."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuquota import testing
from gpuquota.testing import StackError, StackOptions, resolve_mode, stack_options, start_stack

ROOT = Path(__file__).resolve().parents[2]


def test_registered_as_a_pytest11_entry_point(request: pytest.FixtureRequest) -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "gpuquota"]
    assert entry.value == "gpuquota.testing"
    assert request.config.pluginmanager.get_plugin("gpuquota") is testing


def test_docs_show_the_example_test_verbatim() -> None:
    page = (ROOT / "docs" / "testing-your-platform.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    example = (ROOT / "tests" / "plugin" / "test_example.py").read_text()
    assert example in blocks, "docs/testing-your-platform.md must show tests/plugin/test_example.py as is"


@pytest.mark.gpuquota(nodes="ml.p4d.24xlarge=1", runtime="process")
def test_marker_overrides_nodes_and_runtime(request: pytest.FixtureRequest) -> None:
    options = stack_options(request.config, request.node.get_closest_marker("gpuquota"))
    assert (options.nodes, options.runtime) == ("ml.p4d.24xlarge=1", "process")


def test_defaults(request: pytest.FixtureRequest) -> None:
    options = stack_options(request.config)
    assert (options.nodes, options.runtime, options.image) == ("ml.g5.xlarge=3", "simulated", "gpuquota:dev")


@pytest.mark.parametrize(
    "marker",
    [pytest.mark.gpuquota("ml.g5.xlarge=1"), pytest.mark.gpuquota(gpus=2), pytest.mark.gpuquota(runtime="x")],
    ids=["positional", "unknown-keyword", "bad-runtime"],
)
def test_bad_markers_are_usage_errors(request: pytest.FixtureRequest, marker: pytest.MarkDecorator) -> None:
    with pytest.raises(pytest.UsageError):
        stack_options(request.config, marker.mark)


def test_auto_is_embedded_without_docker_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing, "docker_image_available", lambda image: False)
    assert resolve_mode(StackOptions()) == "embedded"
    monkeypatch.setattr(testing, "docker_image_available", lambda image: image == "gpuquota:dev")
    assert resolve_mode(StackOptions()) == "docker"
    assert resolve_mode(StackOptions(mode="embedded")) == "embedded"


def test_distributed_needs_kafka_and_database() -> None:
    with pytest.raises(StackError, match="--gpuquota-kafka"), start_stack(StackOptions(mode="distributed")):
        pass


@pytest.mark.gpuquota(nodes="ml.g5.xlarge=1,ml.p4d.24xlarge=2")
def test_embedded_stack_is_ready(gpuquota_stack: testing.GpuquotaStack) -> None:
    assert gpuquota_stack.mode in ("embedded", "docker")
    assert gpuquota_stack.kafka_bootstrap is None
    assert gpuquota_stack.batch.list_scheduling_policies()["schedulingPolicies"] == []
    with urllib.request.urlopen(f"{gpuquota_stack.endpoint_url}/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok"}


@pytest.mark.integration
def test_distributed_stack(kafka_bootstrap: str, database_url: str) -> None:
    options = StackOptions(
        mode="distributed", nodes="ml.g5.xlarge=1", kafka=kafka_bootstrap, database_url=database_url
    )
    with start_stack(options) as stack:
        assert (stack.mode, stack.kafka_bootstrap) == ("distributed", kafka_bootstrap)
        batch = stack.batch
        batch.create_scheduling_policy(name="p", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
        batch.create_service_environment(
            serviceEnvironmentName="se",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
        )
        batch.create_job_queue(
            jobQueueName="q",
            jobQueueType="SAGEMAKER_TRAINING",
            priority=1,
            schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/p",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
        )
        batch.create_quota_share(
            quotaShareName="s",
            jobQueue="q",
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
        request = {
            "TrainingJobName": "t",
            "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
            "Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": "0.2"},
        }
        job_id = batch.submit_service_job(
            jobName="j",
            jobQueue="q",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="s",
            serviceRequestPayload=json.dumps(request),
        )["jobId"]
        stack.wait_for_status(job_id, "SUCCEEDED", timeout=60)


def test_process_runtime_leaves_no_job_process_behind(tmp_path: Path) -> None:
    script = (
        "import os, time; open(os.environ['SM_CHECKPOINT_DIR'] + '/pid', 'w').write(str(os.getpid())); "
        "time.sleep(600)"
    )
    request = {
        "TrainingJobName": "t",
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
        "AlgorithmSpecification": {"ContainerEntrypoint": [sys.executable, "-c", script]},
    }
    options = StackOptions(mode="embedded", nodes="ml.g5.xlarge=1", runtime="process")
    with start_stack(options, tmp_path) as stack:
        batch = stack.batch
        batch.create_scheduling_policy(name="p", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
        batch.create_service_environment(
            serviceEnvironmentName="se",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
        )
        batch.create_job_queue(
            jobQueueName="q",
            jobQueueType="SAGEMAKER_TRAINING",
            priority=1,
            schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/p",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
        )
        batch.create_quota_share(
            quotaShareName="s",
            jobQueue="q",
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
        job_id = batch.submit_service_job(
            jobName="sleeper",
            jobQueue="q",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="s",
            serviceRequestPayload=json.dumps(request),
        )["jobId"]
        stack.wait_for_status(job_id, "RUNNING")
        deadline = time.monotonic() + 30  # RUNNING comes before the job's interpreter wrote its pid
        while not (pids := [p.read_text() for p in tmp_path.rglob("pid")]) or not pids[0]:
            assert time.monotonic() < deadline, "the job never wrote its pid"
            time.sleep(0.05)
        (pid_text,) = pids
        pid = int(pid_text)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
