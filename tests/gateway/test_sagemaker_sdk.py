"""The SageMaker Python SDK's ``sagemaker.train.aws_batch`` (v3, package ``sagemaker-train``), unmodified.

The SDK makes a new ``boto3.client("batch")`` per call from boto3's default session, so it is pointed
at the gateway only through the environment: ``AWS_ENDPOINT_URL_BATCH``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_DEFAULT_REGION`` (a fresh default session reads them).
``TrainingQueue.submit`` needs a ``ModelTrainer``, whose construction calls IAM (role validation) and
STS (the default S3 bucket): ``SAGEMAKER_VALIDATE_ROLE=false`` and an explicit ``output_data_config``
keep it offline. Nothing of the SDK is patched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from gpuquota.gateway.auth import Keyring
from tests.gateway.conftest import Stack
from tests.gateway.helpers import G5, submit, worked_example

# importing sagemaker.train warns that its own modules moved (sagemaker.train.configs)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def use_gateway(monkeypatch: pytest.MonkeyPatch, url: str, key: str = "x", secret: str = "y") -> Any:
    monkeypatch.setenv("AWS_ENDPOINT_URL_BATCH", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # boto3's own: the next client reads the env
    queue = pytest.importorskip("sagemaker.train.aws_batch.training_queue")
    job = pytest.importorskip("sagemaker.train.aws_batch.training_queued_job")
    return SimpleNamespace(TrainingQueue=queue.TrainingQueue, TrainingQueuedJob=job.TrainingQueuedJob)


def trainer(name: str) -> Any:
    """A ``ModelTrainer`` for one ``ml.g5.xlarge`` (what ``TrainingQueue.submit`` sends as the payload)."""
    configs = pytest.importorskip("sagemaker.train.configs")
    model_trainer = pytest.importorskip("sagemaker.train.model_trainer")
    return model_trainer.ModelTrainer(
        training_image="000000000000.dkr.ecr.us-east-1.amazonaws.com/train:latest",
        role="arn:aws:iam::000000000000:role/training",
        compute=configs.Compute(instance_type=G5, instance_count=1),
        base_job_name=name,
        output_data_config=configs.OutputDataConfig(s3_output_path="s3://bucket/output"),
    )


@pytest.fixture
def sdk(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Any:
    worked_example(stack.client)
    stack.register_node(count=3)
    return use_gateway(monkeypatch, stack.url)


def test_training_queue_and_queued_job(stack: Stack, sdk: Any) -> None:
    queue = sdk.TrainingQueue("jq")
    jobs = {
        name: queue.submit(
            trainer(name), inputs=None, job_name=name, priority=priority, quota_share_name="QS1"
        )
        for name, priority in (("high", 3), ("med", 2), ("low", 1))
    }
    spare = queue.submit(
        trainer("spare"), None, job_name="spare", quota_share_name="QS1", preemption_config={
            "preemptionRetriesBeforeTermination": 0
        }
    )  # fmt: skip
    described = jobs["high"].describe()
    assert described["jobArn"] == jobs["high"].job_arn and described["quotaShareName"] == "QS1"
    assert described["schedulingPriority"] == 3
    payload = json.loads(described["serviceRequestPayload"])
    assert payload["ResourceConfig"]["InstanceType"] == G5
    assert payload["TrainingJobName"].startswith("high")

    def names(status: str, share: str = "QS1") -> set[str]:
        found = queue.list_jobs_by_share(status=status, quota_share_name=share)
        assert all(j.quota_share_name == share for j in found)
        return {j.job_name for j in found}

    # S8 step 1: high on QS1's own instance, med on QS2's idle one, low waits (QS3 reserves its own)
    assert names("SCHEDULED") == {"high", "med"}
    assert names("RUNNABLE") == {"low", "spare"}
    assert names("RUNNING") == names("SCHEDULED", "QS2") == set()
    with pytest.raises(ValueError, match="not both"):
        queue.list_jobs_by_share(share_identifier="x", quota_share_name="QS1")
    assert queue.get_job("low").job_arn == jobs["low"].job_arn

    # TrainingQueuedJob from an ARN and a name, as a notebook keeps them
    low = sdk.TrainingQueuedJob(jobs["low"].job_arn, "low")
    updated = low.update(4)
    assert (updated["jobArn"], updated["jobName"]) == (low.job_arn, "low")
    assert low.describe()["schedulingPriority"] == 4

    running = jobs["high"].job_arn.rsplit("/", 1)[1]
    stack.report(running, "STARTING")
    stack.report(running, "RUNNING")
    assert names("RUNNING") == {"high"}

    sdk.TrainingQueuedJob(spare.job_arn, "spare").terminate(reason="not needed")
    final = spare.describe()
    assert (final["status"], final["isTerminated"], final["statusReason"]) == ("FAILED", True, "not needed")


def test_sdk_signs_with_a_share_limited_key(
    make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [
        {"access_key": "ADMIN", "secret_key": "admin-secret", "admin": True},
        {"access_key": "TEAM2", "secret_key": "team2-secret", "quota_shares": ["jq/QS2"]},
    ]
    stack = make_stack(auth=Keyring.from_data(keys))
    admin = boto3.client(
        "batch",
        endpoint_url=stack.url,
        region_name="us-east-1",
        aws_access_key_id="ADMIN",
        aws_secret_access_key="admin-secret",
    )
    worked_example(admin)
    other = submit(admin, "qs1-job", share="QS1")
    sdk = use_gateway(monkeypatch, stack.url, "TEAM2", "team2-secret")
    queue = sdk.TrainingQueue("jq")
    mine = queue.submit(trainer("qs2"), None, job_name="qs2-job", quota_share_name="QS2")
    assert mine.describe()["quotaShareName"] == "QS2"
    assert [j.job_name for j in queue.list_jobs_by_share("RUNNABLE", quota_share_name="QS2")] == ["qs2-job"]
    assert queue.list_jobs_by_share("RUNNABLE", quota_share_name="QS1") == []
    with pytest.raises(ClientError) as info:
        sdk.TrainingQueuedJob(f"arn:aws:batch:us-east-1:000000000000:service-job/{other}", "x").describe()
    assert info.value.response["Error"]["Code"] == "AccessDeniedException"
    admin.close()
