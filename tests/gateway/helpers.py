"""Request builders for the gateway tests (AWS shapes, as the notebook's helpers send them)."""

from __future__ import annotations

import json
from typing import Any

G5 = "ml.g5.xlarge"
P4 = "ml.p4d.24xlarge"
QUEUE_ARN = "arn:aws:batch:us-east-1:000000000000:job-queue/jq"


def share_arn(name: str, queue: str = "jq") -> str:
    return f"arn:aws:batch:us-east-1:000000000000:job-queue/{queue}/quota-share/{name}"


def payload(unit: str = G5, count: int = 1, **extra: Any) -> str:
    return json.dumps(
        {"TrainingJobName": "t", "ResourceConfig": {"InstanceType": unit, "InstanceCount": count}, **extra}
    )


def create_queue(batch: Any, capacity: int = 3, queue: str = "jq", unit: str = G5) -> None:
    """Policy ``policy``, service environment ``se`` (``capacity`` x ``unit``) and job queue ``queue``."""
    batch.create_scheduling_policy(name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName="se",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": unit, "maxCapacity": capacity}],
    )
    batch.create_job_queue(
        jobQueueName=queue,
        priority=1,
        jobQueueType="SAGEMAKER_TRAINING",
        schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )


def create_share(
    batch: Any,
    name: str,
    strategy: str = "LEND",
    limit: int = 1,
    borrow: int | None = None,
    in_share: bool = False,
    queue: str = "jq",
    unit: str = G5,
    **extra: Any,
) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": strategy}
    if borrow is not None:
        sharing["borrowLimit"] = borrow
    return dict(
        batch.create_quota_share(
            quotaShareName=name,
            jobQueue=queue,
            capacityLimits=[{"capacityUnit": unit, "maxCapacity": limit}],
            resourceSharingConfiguration=sharing,
            preemptionConfiguration={"inSharePreemption": "ENABLED" if in_share else "DISABLED"},
            **extra,
        )
    )


def worked_example(batch: Any) -> None:
    """S8: SE g5 x 3; QS1 LEND_AND_BORROW 200 % with in-share preemption; QS2 LEND; QS3 RESERVE."""
    create_queue(batch)
    create_share(batch, "QS1", "LEND_AND_BORROW", borrow=200, in_share=True)
    create_share(batch, "QS2", "LEND")
    create_share(batch, "QS3", "RESERVE")


def submit(batch: Any, name: str, share: str = "QS1", priority: int | None = None, **extra: Any) -> str:
    fields: dict[str, Any] = {
        "jobName": name,
        "jobQueue": "jq",
        "serviceJobType": "SAGEMAKER_TRAINING",
        "quotaShareName": share,
        "serviceRequestPayload": extra.pop("serviceRequestPayload", payload()),
        **extra,
    }
    if priority is not None:
        fields["schedulingPriority"] = priority
    return str(batch.submit_service_job(**fields)["jobId"])


def status(batch: Any, job_id: str) -> str:
    return str(batch.describe_service_job(jobId=job_id)["status"])
