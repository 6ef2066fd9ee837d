"""Training plans (S11) on a whole stack: node agents of their own, and the scheduler's own ticks (no
test-fed clock) open a window, in the embedded shell and in the distributed pipeline alike."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuquota.testing import StackOptions, start_stack

G5 = "ml.g5.xlarge"
MODES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("distributed", id="distributed", marks=pytest.mark.integration),
]


def until(condition: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.1)  # polling interval, not a synchronisation
    return value


def payload() -> str:
    return json.dumps(
        {
            "TrainingJobName": "train",
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
            "Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": "600"},
        }
    )


@pytest.mark.parametrize("mode", MODES)
def test_the_schedulers_own_ticks_open_a_window(
    mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kafka = database_url = None
    if mode == "distributed":
        kafka, database_url = (
            request.getfixturevalue("kafka_bootstrap"),
            request.getfixturevalue("database_url"),
        )
    options = StackOptions(
        mode=mode,  # type: ignore[arg-type]
        nodes=f"{G5}=1,{G5}=1@p1",
        kafka=kafka,
        database_url=database_url,
    )
    with start_stack(options, tmp_path) as stack:
        batch = stack.batch
        batch.create_scheduling_policy(
            name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}
        )
        batch.create_service_environment(
            serviceEnvironmentName="se",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
        )
        batch.create_job_queue(
            jobQueueName="jq",
            jobQueueType="SAGEMAKER_TRAINING",
            priority=1,
            schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
        )
        batch.create_quota_share(
            quotaShareName="QS1",
            jobQueue="jq",
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
        start = time.time_ns() // 1_000_000 + 3_000
        plan = {
            "trainingPlanName": "p1",
            "serviceEnvironment": "se",
            "capacityUnit": G5,
            "count": 1,
            "windows": [{"start": start, "end": start + 600_000}],
            "allocations": [{"jobQueue": "jq", "quotaShare": "QS1", "count": 1}],
            "gracePeriodSeconds": 10,
        }
        request_ = urllib.request.Request(
            stack.endpoint_url + "/gpuquota/v1/plans",
            data=json.dumps(plan).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request_, timeout=30) as answer:
            assert json.loads(answer.read())["openWindow"] is None
        jobs = [
            batch.submit_service_job(
                jobName=f"j{i}",
                jobQueue="jq",
                serviceJobType="SAGEMAKER_TRAINING",
                quotaShareName="QS1",
                serviceRequestPayload=payload(),
            )["jobId"]
            for i in range(2)
        ]

        def status(job_id: str) -> str:
            return str(batch.describe_service_job(jobId=job_id)["status"])

        until(lambda: status(jobs[0]) in ("SCHEDULED", "STARTING", "RUNNING"), 30)
        assert status(jobs[1]) == "RUNNABLE"  # QS1 (RESERVE, 1) is full until the window opens
        until(lambda: status(jobs[1]) in ("SCHEDULED", "STARTING", "RUNNING"), 60)
        assert time.time_ns() // 1_000_000 >= start
