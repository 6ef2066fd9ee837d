"""The smaller differences from AWS that issue #14 found, each through boto3 (both modes)."""

from __future__ import annotations

from typing import Any

from tests.gateway.conftest import Stack, wait_for
from tests.gateway.helpers import G5, QUEUE_ARN, create_queue, create_share, share_arn, status, submit
from tests.gateway.test_resources import client_error

POLICY_ARN = "arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy"


def queues(batch: Any) -> list[dict[str, Any]]:
    return list(batch.describe_job_queues()["jobQueues"])


def test_describe_job_queues_says_healthy(batch: Any) -> None:
    create_queue(batch)
    (queue,) = queues(batch)
    assert queue["statusReason"] == "JobQueue Healthy"


def test_earliest_time_at_position_is_when_the_job_reached_the_front(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    stack.register_node(count=1)
    first, second, third = (submit(batch, name) for name in ("first", "second", "third"))
    wait_for(lambda: status(batch, first) == "SCHEDULED")
    created = batch.describe_service_job(jobId=third)["createdAt"]
    batch.terminate_service_job(jobId=second, reason="moved on")
    wait_for(lambda: status(batch, second) == "FAILED")

    def front() -> dict[str, Any]:
        snapshot = batch.get_job_queue_snapshot(jobQueue="jq")
        (job,) = snapshot["frontOfQueue"]["jobs"]
        return dict(job)

    job = wait_for(lambda: (j := front())["jobArn"].endswith(third) and j)
    assert job["earliestTimeAtPosition"] > created


def test_terminate_service_jobs_takes_50_and_unknown_ids_succeed(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    job = submit(batch, "j")
    assert "at most 50" in client_error(batch.terminate_service_jobs, jobs=[job] * 51, reason="r")
    answer = batch.terminate_service_jobs(jobs=[job, "no-such-job"], reason="r")
    assert answer["successful"] == [job, "no-such-job"] and answer["errors"] == []
    wait_for(lambda: status(batch, job) == "FAILED")


def test_aws_tag_prefix_is_reserved(batch: Any) -> None:
    create_queue(batch)
    assert "reserved" in client_error(create_share, batch, "QS1", "LEND", limit=1, tags={"aws:owner": "me"})
    create_share(batch, "QS1", "LEND", limit=1)
    assert "reserved" in client_error(batch.tag_resource, resourceArn=share_arn("QS1"), tags={"AWS:x": "y"})
    assert batch.list_tags_for_resource(resourceArn=share_arn("QS1"))["tags"] == {}


def test_a_queue_moves_to_another_service_environment(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch, capacity=1)
    create_share(batch, "QS1", "LEND", limit=2)
    batch.create_service_environment(
        serviceEnvironmentName="se2",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": G5, "maxCapacity": 2}],
    )
    batch.update_job_queue(jobQueue="jq", serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se2"}])
    (queue,) = queues(batch)
    assert queue["serviceEnvironmentOrder"][0]["serviceEnvironment"].endswith("/se2")
    stack.register_node(count=2)
    jobs = [submit(batch, f"j{i}") for i in range(2)]
    wait_for(lambda: all(status(batch, j) == "SCHEDULED" for j in jobs))  # se2's limit of 2 applies


def test_disable_then_delete_a_queue_with_shares_and_jobs(stack: Stack) -> None:
    """AWS asks only that the queue be DISABLED; gpuquota deletes its shares with it and terminates
    their jobs; the queue is gone once the last running job has stopped."""
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    create_share(batch, "QS2", "LEND", limit=1)
    stack.register_node(count=1)
    running, queued = submit(batch, "running"), submit(batch, "queued")
    wait_for(lambda: status(batch, running) == "SCHEDULED")
    batch.update_job_queue(jobQueue=QUEUE_ARN, state="DISABLED")
    batch.delete_job_queue(jobQueue=QUEUE_ARN)
    wait_for(lambda: status(batch, queued) == "FAILED")
    assert batch.describe_service_job(jobId=queued)["statusReason"] == "Job queue jq deleted"
    assert [q["status"] for q in queues(batch)] == ["DELETING"]
    stack.report(running, "STOPPED")
    wait_for(lambda: queues(batch) == [])
    assert batch.describe_service_job(jobId=running)["status"] == "FAILED"
    batch.delete_scheduling_policy(arn=POLICY_ARN)
    batch.update_service_environment(serviceEnvironment="se", state="DISABLED")
    batch.delete_service_environment(serviceEnvironment="se")


def test_the_aws_helpers_teardown_order(batch: Any) -> None:
    """``delete_resources``: quota shares (disable, delete), job queue, scheduling policy, environment."""
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    batch.update_quota_share(quotaShareArn=share_arn("QS1"), state="DISABLED")
    batch.delete_quota_share(quotaShareArn=share_arn("QS1"))
    wait_for(lambda: batch.list_quota_shares(jobQueue="jq")["quotaShares"] == [])
    batch.update_job_queue(jobQueue="jq", state="DISABLED")
    batch.delete_job_queue(jobQueue="jq")
    wait_for(lambda: queues(batch) == [])
    batch.delete_scheduling_policy(arn=POLICY_ARN)
    batch.update_service_environment(serviceEnvironment="se", state="DISABLED")
    batch.delete_service_environment(serviceEnvironment="se")


def test_limits_are_capped_at_what_fits(batch: Any) -> None:
    create_queue(batch)
    assert "at most 2147483647" in client_error(create_share, batch, "QS1", "LEND", limit=2**63)
    assert "at most 2147483647" in client_error(
        create_share, batch, "QS1", "LEND_AND_BORROW", limit=1, borrow=2**64
    )
    create_share(batch, "QS1", "LEND_AND_BORROW", limit=2**31 - 1, borrow=2**31 - 1)
    share = batch.describe_quota_share(quotaShareArn=share_arn("QS1"))
    assert share["capacityLimits"][0]["maxCapacity"] == 2**31 - 1
