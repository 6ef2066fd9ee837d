"""Scheduling policies, service environments, job queues, quota shares and tags through boto3."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.gateway.conftest import Stack, distributed_only, wait_for
from tests.gateway.helpers import G5, P4, QUEUE_ARN, create_queue, create_share, share_arn

POLICY_ARN = "arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy"
SE_ARN = "arn:aws:batch:us-east-1:000000000000:service-environment/se"


def client_error(call: Any, *args: Any, **kwargs: Any) -> str:
    """Call, expect a ClientException, return its message."""
    with pytest.raises(ClientError) as info:
        call(*args, **kwargs)
    error = info.value.response
    assert error["Error"]["Code"] == "ClientException", error
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    return str(error["Error"]["Message"])


def test_scheduling_policy_lifecycle(batch: Any) -> None:
    created = batch.create_scheduling_policy(
        name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}, tags={"team": "ml"}
    )
    assert created["arn"] == POLICY_ARN and created["name"] == "policy"
    described = batch.describe_scheduling_policies(arns=[POLICY_ARN, POLICY_ARN + "-missing"])
    assert described["schedulingPolicies"] == [
        {
            "name": "policy",
            "arn": POLICY_ARN,
            "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"},
            "tags": {"team": "ml"},
        }
    ]
    batch.update_scheduling_policy(
        arn=POLICY_ARN, quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}
    )
    error = client_error(batch.create_scheduling_policy, name="policy")
    assert error == "Object already exists"
    assert "fairsharePolicy" in client_error(
        batch.update_scheduling_policy, arn=POLICY_ARN, fairsharePolicy={"shareDecaySeconds": 1}
    )
    for name in ("p2", "p3"):
        batch.create_scheduling_policy(name=name, quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    page = batch.list_scheduling_policies(maxResults=2)
    assert len(page["schedulingPolicies"]) == 2 and page["nextToken"]
    rest = batch.list_scheduling_policies(maxResults=2, nextToken=page["nextToken"])
    assert [p["arn"].rsplit("/", 1)[1] for p in page["schedulingPolicies"] + rest["schedulingPolicies"]] == [
        "p2",
        "p3",
        "policy",
    ]
    assert "nextToken" not in rest
    batch.delete_scheduling_policy(arn=POLICY_ARN)
    assert batch.describe_scheduling_policies(arns=[POLICY_ARN])["schedulingPolicies"] == []
    assert "does not exist" in client_error(batch.delete_scheduling_policy, arn=POLICY_ARN)


def test_policy_in_use_cannot_be_deleted(batch: Any) -> None:
    create_queue(batch)
    assert "used by job queue jq" in client_error(batch.delete_scheduling_policy, arn=POLICY_ARN)


def test_service_environment_lifecycle(batch: Any) -> None:
    created = batch.create_service_environment(
        serviceEnvironmentName="se",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": G5, "maxCapacity": 3}],
    )
    assert created == {**created, "serviceEnvironmentName": "se", "serviceEnvironmentArn": SE_ARN}
    (env,) = batch.describe_service_environments(serviceEnvironments=["se"])["serviceEnvironments"]
    assert env["status"] == "VALID" and env["state"] == "ENABLED"
    assert env["capacityLimits"] == [{"capacityUnit": G5, "maxCapacity": 3}]
    batch.update_service_environment(
        serviceEnvironment=SE_ARN, state="DISABLED", capacityLimits=[{"capacityUnit": P4, "maxCapacity": 1}]
    )
    (env,) = batch.describe_service_environments()["serviceEnvironments"]
    assert env["state"] == "DISABLED" and env["capacityLimits"] == [{"capacityUnit": P4, "maxCapacity": 1}]
    assert (
        client_error(
            batch.create_service_environment,
            serviceEnvironmentName="se",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 3}],
        )
        == "Object already exists"
    )
    batch.delete_service_environment(serviceEnvironment="se")
    assert batch.describe_service_environments()["serviceEnvironments"] == []


def test_enabled_service_environment_cannot_be_deleted(batch: Any) -> None:
    create_queue(batch)
    assert "must be DISABLED" in client_error(batch.delete_service_environment, serviceEnvironment="se")


def test_job_queue_lifecycle(batch: Any) -> None:
    create_queue(batch)
    (queue,) = batch.describe_job_queues(jobQueues=[QUEUE_ARN])["jobQueues"]
    assert queue["jobQueueName"] == "jq" and queue["jobQueueArn"] == QUEUE_ARN
    assert queue["status"] == "VALID" and queue["state"] == "ENABLED" and queue["priority"] == 1
    assert queue["schedulingPolicyArn"] == POLICY_ARN and queue["jobQueueType"] == "SAGEMAKER_TRAINING"
    assert queue["serviceEnvironmentOrder"] == [{"order": 1, "serviceEnvironment": SE_ARN}]
    batch.update_job_queue(
        jobQueue="jq",
        priority=5,
        jobStateTimeLimitActions=[
            {
                "reason": "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
                "state": "RUNNABLE",
                "maxTimeSeconds": 600,
                "action": "TERMINATE",
            }
        ],
    )
    (queue,) = batch.describe_job_queues()["jobQueues"]
    assert queue["priority"] == 5 and queue["jobStateTimeLimitActions"][0]["maxTimeSeconds"] == 600
    assert "must be DISABLED" in client_error(batch.delete_job_queue, jobQueue="jq")
    batch.update_job_queue(jobQueue=QUEUE_ARN, state="DISABLED")
    batch.delete_job_queue(jobQueue=QUEUE_ARN)
    assert batch.describe_job_queues()["jobQueues"] == []


def test_job_queue_validation(batch: Any) -> None:
    create_queue(batch)
    base = {
        "jobQueueName": "jq2",
        "priority": 1,
        "schedulingPolicyArn": POLICY_ARN,
        "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}],
    }
    assert (
        client_error(batch.create_job_queue, **base)
        == "Service environment se is already used by job queue jq"
    )
    assert "between 0 and 1000" in client_error(batch.create_job_queue, **{**base, "priority": 1001})
    assert "1 to 128 characters" in client_error(
        batch.create_job_queue, **{**base, "jobQueueName": "a" * 129}
    )
    assert (
        client_error(
            batch.create_job_queue,
            **{**base, "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "nope"}]},
        )
        == "Service environment nope does not exist"
    )
    actions = [
        {
            "reason": "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
            "state": "RUNNABLE",
            "maxTimeSeconds": 599,
            "action": "TERMINATE",
        }
    ]
    assert "between 600 and 86400" in client_error(
        batch.create_job_queue, **base, jobStateTimeLimitActions=actions
    )
    actions[0].update(maxTimeSeconds=600, action="CANCEL")
    assert "TERMINATE" in client_error(batch.create_job_queue, **base, jobStateTimeLimitActions=actions)


def test_quota_share_lifecycle(batch: Any) -> None:
    create_queue(batch)
    created = create_share(
        batch, "QS1", "LEND_AND_BORROW", limit=2, borrow=100, in_share=True, tags={"a": "1"}
    )
    arn = share_arn("QS1")
    assert created["quotaShareArn"] == arn and created["quotaShareName"] == "QS1"
    described = batch.describe_quota_share(quotaShareArn=arn)
    described.pop("ResponseMetadata")
    assert described == {
        "quotaShareName": "QS1",
        "quotaShareArn": arn,
        "jobQueueArn": QUEUE_ARN,
        "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 2}],
        "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 100},
        "preemptionConfiguration": {"inSharePreemption": "ENABLED"},
        "state": "ENABLED",
        "status": "VALID",
        "tags": {"a": "1"},
    }
    create_share(batch, "QS2", "RESERVE")
    reserve = batch.describe_quota_share(quotaShareArn=share_arn("QS2"))
    assert reserve["resourceSharingConfiguration"] == {"strategy": "RESERVE"}

    batch.update_quota_share(
        quotaShareArn=arn, capacityLimits=[{"capacityUnit": G5, "maxCapacity": 3}], state="DISABLED"
    )
    described = batch.describe_quota_share(quotaShareArn=arn)
    assert described["capacityLimits"] == [{"capacityUnit": G5, "maxCapacity": 3}]
    assert (
        described["state"] == "DISABLED" and described["resourceSharingConfiguration"]["borrowLimit"] == 100
    )

    listed = batch.list_quota_shares(jobQueue="jq", maxResults=1)
    assert [s["quotaShareName"] for s in listed["quotaShares"]] == ["QS1"] and "tags" not in listed[
        "quotaShares"
    ][0]
    listed = batch.list_quota_shares(jobQueue=QUEUE_ARN, nextToken=listed["nextToken"])
    assert [s["quotaShareName"] for s in listed["quotaShares"]] == ["QS2"] and "nextToken" not in listed

    assert "must be DISABLED" in client_error(batch.delete_quota_share, quotaShareArn=share_arn("QS2"))
    batch.delete_quota_share(quotaShareArn=arn)
    assert "does not exist" in client_error(batch.describe_quota_share, quotaShareArn=arn)


def test_quota_share_validation(batch: Any) -> None:
    create_queue(batch)
    create_share(batch, "QS1")
    assert "already exists" in client_error(create_share, batch, "QS1")
    assert "between 1 and 5 capacity limits" in client_error(
        batch.create_quota_share,
        quotaShareName="QS9",
        jobQueue="jq",
        capacityLimits=[],
        resourceSharingConfiguration={"strategy": "LEND"},
        preemptionConfiguration={"inSharePreemption": "DISABLED"},
    )
    six = [{"capacityUnit": f"ml.unit{i}", "maxCapacity": 1} for i in range(6)]
    assert "between 1 and 5 capacity limits" in client_error(
        batch.create_quota_share,
        quotaShareName="QS9",
        jobQueue="jq",
        capacityLimits=six,
        resourceSharingConfiguration={"strategy": "LEND"},
        preemptionConfiguration={"inSharePreemption": "DISABLED"},
    )
    assert "at least -1" in client_error(create_share, batch, "QS9", "LEND_AND_BORROW", borrow=-2)
    assert "only be applied" in client_error(create_share, batch, "QS9", "LEND", borrow=50)
    assert "1 to 128 characters" in client_error(create_share, batch, "x" * 129)
    assert "1 to 128 characters" in client_error(create_share, batch, "bad name")
    assert "at least 1" in client_error(create_share, batch, "QS9", limit=0)
    assert client_error(create_share, batch, "QS9", queue="nope") == "Job queue nope does not exist"
    assert "strategy must be one of" in client_error(create_share, batch, "QS9", "SHARE")
    for index in range(2, 21):
        create_share(batch, f"QS{index}")
    assert "already has 20 quota shares" in client_error(create_share, batch, "QS21")


def test_tags_on_every_resource(batch: Any) -> None:
    create_queue(batch)
    create_share(batch, "QS1")
    job = batch.submit_service_job(
        jobName="j",
        jobQueue="jq",
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="QS1",
        serviceRequestPayload='{"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}}',
        tags={"k0": "v0"},
    )
    for arn, initial in (
        (POLICY_ARN, {}),
        (SE_ARN, {}),
        (QUEUE_ARN, {}),
        (share_arn("QS1"), {}),
        (job["jobArn"], {"k0": "v0"}),
    ):
        assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == initial
        batch.tag_resource(resourceArn=arn, tags={"k1": "v1", "k2": "v2"})
        assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {**initial, "k1": "v1", "k2": "v2"}
        batch.untag_resource(resourceArn=arn, tagKeys=["k1", "k0"])
        assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"k2": "v2"}
    assert batch.describe_quota_share(quotaShareArn=share_arn("QS1"))["tags"] == {"k2": "v2"}
    assert batch.describe_service_job(jobId=job["jobId"])["tags"] == {"k2": "v2"}
    assert "does not exist" in client_error(
        batch.list_tags_for_resource, resourceArn=QUEUE_ARN.replace("/jq", "/nope")
    )
    assert "not a taggable" in client_error(
        batch.tag_resource, resourceArn="arn:aws:s3:::bucket", tags={"a": "b"}
    )
    too_many = {f"k{i}": "v" for i in range(51)}
    assert "at most 50 tags" in client_error(batch.tag_resource, resourceArn=QUEUE_ARN, tags=too_many)


def test_rules_only_the_core_checks(batch: Any) -> None:
    """Duplicate capacity units (checked by the gateway), and rules only the core checks: the gateway
    forwards the write and the core rejects it (in distributed mode the rejection comes back through
    Kafka and the log, within the decision timeout). The rejected writes leave nothing behind."""
    create_queue(batch)
    create_share(batch, "QS1")
    twice = [{"capacityUnit": G5, "maxCapacity": 1}] * 2
    share_config: dict[str, Any] = {
        "resourceSharingConfiguration": {"strategy": "LEND"},
        "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
    }
    assert (
        client_error(
            batch.create_service_environment,
            serviceEnvironmentName="se2",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=twice,
        )
        == "capacityLimits lists a capacityUnit more than once"
    )
    assert "more than once" in client_error(
        batch.update_service_environment, serviceEnvironment="se", capacityLimits=twice
    )
    assert "more than once" in client_error(
        batch.create_quota_share, quotaShareName="QS9", jobQueue="jq", capacityLimits=twice, **share_config
    )
    assert "more than once" in client_error(
        batch.update_quota_share, quotaShareArn=share_arn("QS1"), capacityLimits=twice
    )
    batch.create_service_environment(
        serviceEnvironmentName="se2",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
    )
    batch.update_service_environment(serviceEnvironment="se", state="DISABLED")
    assert client_error(batch.delete_service_environment, serviceEnvironment="se") == (
        "Service environment se is attached to job queue jq"
    )
    # the rejected writes changed nothing
    envs = {
        e["serviceEnvironmentName"]: e for e in batch.describe_service_environments()["serviceEnvironments"]
    }
    assert envs["se"]["capacityLimits"] == [{"capacityUnit": G5, "maxCapacity": 3}]
    assert envs["se"]["status"] == envs["se2"]["status"] == "VALID"
    (queue,) = batch.describe_job_queues(jobQueues=["jq"])["jobQueues"]
    assert queue["status"] == "VALID" and queue["serviceEnvironmentOrder"][0]["serviceEnvironment"] == SE_ARN
    assert [s["quotaShareName"] for s in batch.list_quota_shares(jobQueue="jq")["quotaShares"]] == ["QS1"]
    share = batch.describe_quota_share(quotaShareArn=share_arn("QS1"))
    assert share["capacityLimits"] == [{"capacityUnit": G5, "maxCapacity": 1}] and share["status"] == "VALID"


@distributed_only("only the distributed gateway can answer before the core has decided")
def test_a_late_rejection_reverts_the_pending_view(stack: Stack, batch: Any) -> None:
    """docs/distributed.md: past the decision timeout a write is accepted and decided later. Meanwhile
    the resource shows the write's pending status (CREATING, UPDATING, DELETING); a rejection that
    comes later must revert it, as a timely one does (test_rules_only_the_core_checks)."""
    create_queue(batch)
    create_share(batch, "QS1")
    se2 = [{"order": 1, "serviceEnvironment": "se2"}]
    batch.create_service_environment(
        serviceEnvironmentName="se2",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
    )
    batch.create_job_queue(
        jobQueueName="jq3",
        priority=1,
        schedulingPolicyArn=POLICY_ARN,
        serviceEnvironmentOrder=se2,
    )
    batch.update_service_environment(serviceEnvironment="se", state="DISABLED")
    port: Any = stack.gateway.port
    port.decision_timeout = 0.0  # as if the scheduler were slow: never wait for the decision
    # each accepted now, rejected by the core later
    batch.create_job_queue(
        jobQueueName="jq2",
        priority=1,
        schedulingPolicyArn=POLICY_ARN,
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )
    batch.update_job_queue(jobQueue="jq", serviceEnvironmentOrder=se2)  # se2 is jq3's
    batch.delete_job_queue(jobQueue="jq")  # two writes pending on jq, both rejected (jq is ENABLED)
    batch.delete_service_environment(serviceEnvironment="se")

    def settled() -> bool:
        queues = {q["jobQueueName"]: q for q in batch.describe_job_queues()["jobQueues"]}
        (env,) = batch.describe_service_environments(serviceEnvironments=["se"])["serviceEnvironments"]
        return set(queues) == {"jq", "jq3"} and queues["jq"]["status"] == env["status"] == "VALID"

    wait_for(settled, timeout=20)
    (queue,) = batch.describe_job_queues(jobQueues=["jq"])["jobQueues"]
    assert queue["state"] == "ENABLED"
    assert queue["serviceEnvironmentOrder"] == [{"order": 1, "serviceEnvironment": SE_ARN}]
    port.decision_timeout = 20.0  # the same write, decided in time: the rejection is the answer
    message = client_error(
        batch.create_job_queue,
        jobQueueName="jq2",
        priority=1,
        schedulingPolicyArn=POLICY_ARN,
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )
    assert message == "Service environment se is already used by job queue jq"
