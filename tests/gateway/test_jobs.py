"""Service jobs through boto3: submit validation, describe, update, list filters, terminate, snapshot."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.gateway.conftest import Stack, distributed_only, wait_for
from tests.gateway.helpers import (
    G5,
    P4,
    QUEUE_ARN,
    create_queue,
    create_share,
    payload,
    status,
    submit,
    worked_example,
)
from tests.gateway.test_resources import client_error


@pytest.fixture
def queue(batch: Any) -> Any:
    create_queue(batch)
    create_share(batch, "QS1", "LEND_AND_BORROW", limit=1)
    create_share(batch, "QS2", "LEND", limit=2)
    return batch


def test_submit_and_describe(stack: Stack, queue: Any) -> None:
    body = payload(G5, 1, AlgorithmSpecification={"TrainingImage": "x"})
    job = queue.submit_service_job(
        jobName="train-1",
        jobQueue=QUEUE_ARN,
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="QS1",
        serviceRequestPayload=body,
        schedulingPriority=7,
        retryStrategy={"attempts": 3, "evaluateOnExit": [{"action": "RETRY", "onStatusReason": "Internal*"}]},
        preemptionConfiguration={"preemptionRetriesBeforeTermination": 2},
        timeoutConfig={"attemptDurationSeconds": 3600},
        tags={"project": "x"},
    )
    assert job["jobArn"] == f"arn:aws:batch:us-east-1:000000000000:service-job/{job['jobId']}"
    described = queue.describe_service_job(jobId=job["jobArn"])
    described.pop("ResponseMetadata")
    # S9.1: no node is registered yet, so the head job is blocked for capacity (as on AWS).
    blocked = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Job needs 1 ml.g5.xlarge but the online nodes"
    assert described.pop("statusReason").startswith(blocked)
    assert described == {
        "jobId": job["jobId"],
        "jobArn": job["jobArn"],
        "jobName": "train-1",
        "jobQueue": QUEUE_ARN,
        "serviceJobType": "SAGEMAKER_TRAINING",
        "serviceRequestPayload": body,
        "status": "RUNNABLE",
        "createdAt": described["createdAt"],
        "schedulingPriority": 7,
        "quotaShareName": "QS1",
        "retryStrategy": {
            "attempts": 3,
            "evaluateOnExit": [{"action": "RETRY", "onStatusReason": "Internal*"}],
        },
        "preemptionConfiguration": {"preemptionRetriesBeforeTermination": 2},
        "attempts": [],
        "capacityUsage": [{"capacityUnit": G5, "quantity": 1.0}],
        "timeoutConfig": {"attemptDurationSeconds": 3600},
        "isTerminated": False,
        "tags": {"project": "x"},
    }
    stack.register_node(count=1)
    assert status(queue, job["jobId"]) == "SCHEDULED"


def test_submit_validation(queue: Any) -> None:
    good = {
        "jobName": "j",
        "jobQueue": "jq",
        "serviceJobType": "SAGEMAKER_TRAINING",
        "quotaShareName": "QS1",
        "serviceRequestPayload": payload(),
    }

    def error(**changes: Any) -> str:
        fields = {k: v for k, v in {**good, **changes}.items() if v is not None}
        return client_error(queue.submit_service_job, **fields)

    assert "quotaShareName must be specified" in error(quotaShareName=None)
    assert "shareIdentifier" in error(shareIdentifier="a")
    assert error(quotaShareName="nope") == "Quota share nope does not exist in job queue jq"
    assert error(jobQueue="nope") == "Job queue nope does not exist"
    assert "between 0 and 9999" in error(schedulingPriority=10000)
    assert "between 0 and 9999" in error(schedulingPriority=-1)
    assert "between 1 and 10" in error(retryStrategy={"attempts": 11})
    assert "between 1 and 10" in error(retryStrategy={"attempts": 0})
    rules = [{"action": "RETRY", "onStatusReason": "*"}] * 6
    assert "at most 5 entries" in error(retryStrategy={"attempts": 2, "evaluateOnExit": rules})
    assert "1 to 128 characters" in error(jobName="bad name")
    assert "serviceRequestPayload is not valid JSON" in error(serviceRequestPayload="not json")
    assert "ResourceConfig" in error(serviceRequestPayload="{}")
    assert "10 KiB" in error(serviceRequestPayload=payload(Padding="x" * 10_300))
    assert "at least 1" in error(serviceRequestPayload=payload(count=0))
    assert "no capacity limit for instance type ml.p4d.24xlarge" in error(serviceRequestPayload=payload(P4))
    assert "1 to 64 characters" in error(clientToken="t" * 65)
    assert "must be at least 0" in error(preemptionConfiguration={"preemptionRetriesBeforeTermination": -1})
    big_tags = {f"{i:02d}".ljust(128, "k"): "v" * 256 for i in range(50)}  # about 19.7 KB
    quoted = payload(P='"' * 3000)  # 6 KB of payload, 12 KB once escaped again in the request body
    assert "30 KiB" in error(tags=big_tags, serviceRequestPayload=quoted)
    queue.update_quota_share(
        quotaShareArn="arn:aws:batch:us-east-1:000000000000:job-queue/jq/quota-share/QS2", state="DISABLED"
    )
    assert error(quotaShareName="QS2") == "Quota share QS2 is DISABLED"
    queue.update_job_queue(jobQueue="jq", state="DISABLED")
    assert error() == "Job queue jq is DISABLED"
    # nothing of the rejected submissions is left behind
    assert (
        queue.list_service_jobs(jobQueue="jq", filters=[{"name": "JOB_NAME", "values": ["*"]}])[
            "jobSummaryList"
        ]
        == []
    )


@distributed_only("only the distributed gateway can answer before the core has decided")
def test_a_write_not_decided_in_time_is_accepted_and_decided_later(stack: Stack, queue: Any) -> None:
    """docs/distributed.md: the Kafka port waits at most ``decision_timeout`` for the scheduler's
    decision; past it the write is accepted (it is durable in Kafka) and decided later. So a core
    rejection (here: no capacity limit for the instance type, a ClientException in
    test_submit_validation) arrives asynchronously: the call succeeds and the pending job goes away."""
    port: Any = stack.gateway.port
    port.decision_timeout = 0.0  # as if the scheduler were slow: never wait for the decision
    rejected = submit(queue, "p4", serviceRequestPayload=payload(P4))
    accepted = submit(queue, "g5")

    def gone(job_id: str) -> bool:
        try:
            queue.describe_service_job(jobId=job_id)
        except ClientError as exc:
            assert exc.response["Error"]["Message"] == f"Service job {job_id} does not exist"
            return True
        return False

    wait_for(lambda: gone(rejected), timeout=20)
    wait_for(lambda: status(queue, accepted) == "RUNNABLE", timeout=20)


def test_client_token_is_idempotent(queue: Any) -> None:
    first = submit(queue, "j", clientToken="token-1")
    assert submit(queue, "j", clientToken="token-1") == first
    assert "different request" in client_error(submit, queue, "other", clientToken="token-1")
    assert submit(queue, "j", clientToken="token-2") != first


def test_update_and_terminate(stack: Stack, queue: Any) -> None:
    runnable = submit(queue, "a", priority=1)
    updated = queue.update_service_job(jobId=runnable, schedulingPriority=9)
    assert updated["jobName"] == "a" and updated["jobArn"].endswith(runnable)
    assert queue.describe_service_job(jobId=runnable)["schedulingPriority"] == 9
    queue.terminate_service_job(jobId=runnable, reason="no longer needed")
    job = queue.describe_service_job(jobId=runnable)
    assert (job["status"], job["statusReason"], job["isTerminated"]) == ("FAILED", "no longer needed", True)
    assert "FAILED" in client_error(queue.update_service_job, jobId=runnable, schedulingPriority=1)
    queue.terminate_service_job(jobId=runnable, reason="again")  # terminal: nothing to do
    assert "does not exist" in client_error(queue.describe_service_job, jobId="nope")
    assert "between 0 and 9999" in client_error(
        queue.update_service_job, jobId=runnable, schedulingPriority=10**5
    )

    # A dispatched job stops on its node first, then fails as terminated.
    stack.register_node(count=3)
    running = submit(queue, "b")
    stack.report(running, "STARTING")
    stack.report(running, "RUNNING")
    queue.terminate_service_job(jobId=running, reason="stop it")
    assert status(queue, running) == "RUNNING"
    stack.report(running, "STOPPED")
    job = queue.describe_service_job(jobId=running)
    assert (job["status"], job["statusReason"], job["isTerminated"]) == ("FAILED", "stop it", True)
    assert job["attempts"][0]["statusReason"] == "stop it"


def test_terminate_many(queue: Any) -> None:
    a, b = submit(queue, "a"), submit(queue, "b")
    result = queue.terminate_service_jobs(jobs=[a, b, "missing"], reason="cleanup")
    assert result["successful"] == [a, b, "missing"]  # as on AWS: unknown ids succeed
    assert result["errors"] == []
    assert status(queue, a) == status(queue, b) == "FAILED"


def names(response: dict[str, Any]) -> list[str]:
    return [j["jobName"] for j in response["jobSummaryList"]]


def test_list_filters_and_pagination(stack: Stack, queue: Any) -> None:
    stack.register_node(count=1)
    ids = {
        name: submit(queue, name, share)
        for name, share in (("Alpha-1", "QS1"), ("alpha-2", "QS2"), ("beta", "QS2"))
    }
    stack.report(ids["Alpha-1"], "STARTING")
    stack.report(ids["Alpha-1"], "RUNNING")
    # no status and no filter: RUNNING only
    assert names(queue.list_service_jobs(jobQueue="jq")) == ["Alpha-1"]
    assert names(queue.list_service_jobs(jobQueue="jq", jobStatus="RUNNABLE")) == ["beta", "alpha-2"]
    # JOB_NAME: case-insensitive, trailing * = prefix, ignores jobStatus, newest first
    by_name = queue.list_service_jobs(
        jobQueue="jq", jobStatus="RUNNING", filters=[{"name": "JOB_NAME", "values": ["ALPHA*"]}]
    )
    assert names(by_name) == ["alpha-2", "Alpha-1"]
    assert names(queue.list_service_jobs(filters=[{"name": "JOB_NAME", "values": ["beta"]}])) == ["beta"]
    # QUOTA_SHARE_NAME combines with jobStatus
    share = [{"name": "QUOTA_SHARE_NAME", "values": ["QS2"]}]
    assert names(queue.list_service_jobs(jobQueue="jq", filters=share)) == ["beta", "alpha-2"]
    assert names(queue.list_service_jobs(jobQueue="jq", filters=share, jobStatus="RUNNING")) == []
    # created-at filters
    created = {
        j["jobName"]: j["createdAt"]
        for j in queue.list_service_jobs(filters=[{"name": "JOB_NAME", "values": ["*"]}])["jobSummaryList"]
    }
    before = [{"name": "BEFORE_CREATED_AT", "values": [str(created["beta"])]}]
    assert "beta" not in names(queue.list_service_jobs(filters=before))
    after = [{"name": "AFTER_CREATED_AT", "values": [str(created["Alpha-1"])]}]
    assert "Alpha-1" not in names(queue.list_service_jobs(filters=after))
    assert names(queue.list_service_jobs(filters=[{"name": "SHARE_IDENTIFIER", "values": ["x"]}])) == []
    # summary shape
    (summary,) = queue.list_service_jobs(jobQueue="jq")["jobSummaryList"]
    assert summary["quotaShareName"] == "QS1" and summary["latestAttempt"]["serviceResourceId"]["value"]
    assert "schedulingPriority" not in summary and "preemptionSummary" not in summary
    # pagination
    everything = [{"name": "JOB_NAME", "values": ["*"]}]
    first = queue.list_service_jobs(filters=everything, maxResults=2)
    second = queue.list_service_jobs(filters=everything, maxResults=2, nextToken=first["nextToken"])
    assert names(first) + names(second) == ["beta", "alpha-2", "Alpha-1"] and "nextToken" not in second
    paginator = queue.get_paginator("list_service_jobs")
    pages = list(paginator.paginate(filters=everything, PaginationConfig={"PageSize": 1}))
    assert [n for page in pages for n in names(page)] == ["beta", "alpha-2", "Alpha-1"]
    # rule violations
    two = [{"name": "JOB_NAME", "values": ["a"]}, {"name": "QUOTA_SHARE_NAME", "values": ["QS1"]}]
    assert "Only one filter" in client_error(queue.list_service_jobs, filters=two)
    assert "name must be one of" in client_error(
        queue.list_service_jobs, filters=[{"name": "NOPE", "values": ["a"]}]
    )
    assert "epoch milliseconds" in client_error(
        queue.list_service_jobs, filters=[{"name": "AFTER_CREATED_AT", "values": ["yesterday"]}]
    )
    assert "between 1 and 100" in client_error(queue.list_service_jobs, maxResults=101)
    assert "between 1 and 100" in client_error(queue.list_service_jobs, maxResults=0)
    assert client_error(queue.list_service_jobs, nextToken="garbage") == "Invalid value for nextToken"


def test_snapshot_of_a_waiting_queue(stack: Stack, queue: Any) -> None:
    first = submit(queue, "first", "QS2", priority=1)
    urgent = submit(queue, "urgent", "QS2", priority=5)
    other = submit(queue, "other", "QS1")
    snap = queue.get_job_queue_snapshot(jobQueue=QUEUE_ARN)
    fronts = {
        k: [j["jobArn"].rsplit("/", 1)[1] for j in v]
        for k, v in snap["frontOfQuotaShares"]["quotaShares"].items()
    }
    assert fronts == {"QS1": [other], "QS2": [urgent]}
    order = [j["jobArn"].rsplit("/", 1)[1] for j in snap["frontOfQueue"]["jobs"]]
    assert order == [urgent, first, other]
    assert snap["queueUtilization"]["totalCapacityUsage"] == []
    assert all(j["earliestTimeAtPosition"] > 0 for j in snap["frontOfQueue"]["jobs"])
    assert "does not exist" in client_error(queue.get_job_queue_snapshot, jobQueue="nope")


def test_preemption_retries_exhausted(stack: Stack, batch: Any) -> None:
    create_queue(batch, capacity=2)
    create_share(batch, "QS1", "LEND_AND_BORROW", limit=1)
    create_share(batch, "QS2", "LEND", limit=1)
    stack.register_node(count=2)
    own = submit(batch, "own", "QS1", priority=5)
    borrower = submit(
        batch, "borrower", "QS1", preemptionConfiguration={"preemptionRetriesBeforeTermination": 0}
    )
    for job_id in (own, borrower):
        stack.report(job_id, "STARTING")
        stack.report(job_id, "RUNNING")
    reclaimer = submit(batch, "reclaimer", "QS2")
    stack.report(borrower, "STOPPED")
    job = batch.describe_service_job(jobId=borrower)
    assert job["status"] == "FAILED" and "preemption retries exhausted" in job["statusReason"]
    assert job["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert status(batch, reclaimer) == "SCHEDULED" and status(batch, own) == "RUNNING"


def test_payload_json_round_trip(queue: Any) -> None:
    body = json.dumps(
        {"ResourceConfig": {"InstanceType": G5, "InstanceCount": 2}, "HyperParameters": {"lr": "0.1"}}
    )
    job_id = submit(queue, "two", "QS2", serviceRequestPayload=body)
    job = queue.describe_service_job(jobId=job_id)
    assert json.loads(job["serviceRequestPayload"]) == json.loads(body)
    assert job["capacityUsage"] == [{"capacityUnit": G5, "quantity": 2.0}]


def test_errors_carry_the_modeled_message(queue: Any) -> None:
    with pytest.raises(ClientError) as info:
        queue.describe_quota_share(
            quotaShareArn="arn:aws:batch:us-east-1:000000000000:job-queue/jq/quota-share/X"
        )
    # botocore copies the modeled exception's members (ClientException.message) to the top level
    assert info.value.response["message"] == info.value.response["Error"]["Message"]
    assert "does not exist" in info.value.response["message"]


def test_restart_continues_from_the_log(make_stack: Callable[..., Stack]) -> None:
    """Embedded: a new stack over the SQLite log; distributed: a new gateway folding the pool's log."""
    first = make_stack(durable=True)
    worked_example(first.client)
    first.register_node(count=3)
    job_id = submit(first.client, "a", "QS1", 3)
    first.report(job_id, "STARTING")
    first.report(job_id, "RUNNING")
    waiting = submit(first.client, "b", "QS3")
    first.client.terminate_service_job(jobId=waiting, reason="gone")
    first.report(waiting, "STOPPED")
    before = first.client.describe_service_job(jobId=job_id)
    second = first.reopen()
    try:
        batch = second.client
        after = batch.describe_service_job(jobId=job_id)
        assert {k: v for k, v in after.items() if k != "ResponseMetadata"} == {
            k: v for k, v in before.items() if k != "ResponseMetadata"
        }
        assert status(batch, waiting) == "FAILED"
        assert [s["quotaShareName"] for s in batch.list_quota_shares(jobQueue="jq")["quotaShares"]] == [
            "QS1",
            "QS2",
            "QS3",
        ]
        second.report(job_id, "SUCCEEDED")
        assert status(batch, job_id) == "SUCCEEDED"
    finally:
        second.close()
