"""Where migrating AWS users look first (issue #14): blocked-job reasons, time-limit actions, texts.

S9.1: a RUNNABLE job that can never run as things are carries a ``statusReason`` (AWS's codes), in
DescribeServiceJob and in ListServiceJobs, wherever it waits; S9.2: ``jobStateTimeLimitActions`` act
only on such jobs at the head of their share.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

from tests.gateway.conftest import Stack, wait_for
from tests.gateway.helpers import QUEUE_ARN, create_queue, create_share, payload, share_arn, status, submit
from tests.gateway.test_gpuquota_endpoints import get
from tests.gateway.test_resources import client_error

SE_MAX = "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE"
QUOTA_LIMIT = "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
NO_NODES = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"


def reason(batch: Any, job_id: str) -> str | None:
    found: str | None = batch.describe_service_job(jobId=job_id).get("statusReason")
    return found


def listed_reasons(batch: Any) -> dict[str, str | None]:
    jobs = batch.list_service_jobs(jobQueue="jq", jobStatus="RUNNABLE")["jobSummaryList"]
    return {j["jobName"]: j.get("statusReason") for j in jobs}


def explanation(stack: Stack, job_id: str) -> dict[str, Any]:
    arn = urllib.parse.quote(job_id, safe="")
    body: dict[str, Any] = get(stack, f"/gpuquota/v1/jobs/{arn}/explain")[2]["explanation"]
    return body


def test_blocked_heads_carry_aws_reasons(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch, capacity=3)
    create_share(batch, "A", "LEND", limit=1)
    create_share(batch, "B", "LEND_AND_BORROW", limit=1)
    create_share(batch, "C", "LEND", limit=1)
    stack.register_node(count=2)
    too_big = submit(batch, "too-big", "B", serviceRequestPayload=payload(count=4))
    over_share = submit(batch, "over-share", "A", serviceRequestPayload=payload(count=2))
    no_nodes = submit(batch, "no-nodes", "B", priority=9, serviceRequestPayload=payload(count=3))
    running = submit(batch, "running", "C")
    waiting = submit(batch, "waiting", "C")

    wait_for(lambda: status(batch, running) == "SCHEDULED")
    assert wait_for(lambda: reason(batch, over_share)) == (
        f"{QUOTA_LIMIT} - Job needs 2 ml.g5.xlarge but quota share A may hold at most 1"
    )
    assert str(reason(batch, no_nodes)).startswith(f"{NO_NODES} - Job needs 3 ml.g5.xlarge")
    # too-big waits behind no-nodes (priority 9) but can never run: it says so (AWS only at the head);
    # waiting only waits for its share's limit: no reason.
    too_big_reason = f"{SE_MAX} - Job needs 4 ml.g5.xlarge but service environment se allows at most 3"
    assert wait_for(lambda: reason(batch, too_big)) == too_big_reason and reason(batch, waiting) is None
    assert listed_reasons(batch) == {
        "too-big": too_big_reason,
        "over-share": reason(batch, over_share),
        "no-nodes": reason(batch, no_nodes),
        "waiting": None,
    }
    assert explanation(stack, waiting)["reason"] == "WAITING_FOR_OWN_QUOTA"
    never = explanation(stack, over_share)
    assert never["reason"] == QUOTA_LIMIT and never["message"] == reason(batch, over_share)
    assert never["action"] == (
        "Terminate it, resubmit it needing at most 1, or raise quota share A's limit for ml.g5.xlarge to "
        "at least 2 (or make it LEND_AND_BORROW with a borrowLimit)"
    )
    assert explanation(stack, too_big)["action"].startswith("Terminate it, resubmit it needing at most 3")

    # A node joins: no-nodes is no longer blocked (it now waits for capacity C's job holds).
    stack.register_node("node-2", count=2)
    assert wait_for(lambda: reason(batch, no_nodes) is None)
    # The head leaves: too-big is now the head, blocked by the environment's limit.
    batch.terminate_service_job(jobId=no_nodes, reason="not needed")
    assert wait_for(lambda: reason(batch, too_big)) == too_big_reason
    assert explanation(stack, too_big)["reason"] == SE_MAX


def test_time_limit_actions_fail_only_heads_blocked_with_their_reason(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch, capacity=3)
    create_share(batch, "A", "RESERVE", limit=1)
    create_share(batch, "B", "LEND", limit=1)
    actions = [{"reason": QUOTA_LIMIT, "state": "RUNNABLE", "maxTimeSeconds": 600, "action": "TERMINATE"}]
    batch.update_job_queue(jobQueue="jq", jobStateTimeLimitActions=actions)
    stack.register_node(count=3)
    a1, a2 = submit(batch, "a1", "A"), submit(batch, "a2", "A")
    b1, b2 = submit(batch, "b1", "B"), submit(batch, "b2", "B", serviceRequestPayload=payload(count=2))
    wait_for(lambda: status(batch, a1) == "SCHEDULED" and status(batch, b1) == "SCHEDULED")
    assert str(wait_for(lambda: reason(batch, b2), timeout=20)).startswith(QUOTA_LIMIT)

    stack.tick_later(601)
    wait_for(lambda: status(batch, b2) == "FAILED", timeout=20)
    described = batch.describe_service_job(jobId=b2)
    assert described["statusReason"] == f"Terminated by JobStateTimeLimit action due to reason: {QUOTA_LIMIT}"
    # a2 only waited its turn at its share's limit: AWS leaves it alone, and so does gpuquota.
    assert status(batch, a2) == "RUNNABLE"


def test_time_limit_reason_must_be_a_blocked_code(batch: Any) -> None:
    create_queue(batch)
    actions = [{"reason": "Stuck", "state": "RUNNABLE", "maxTimeSeconds": 600, "action": "TERMINATE"}]
    message = client_error(batch.update_job_queue, jobQueue=QUEUE_ARN, jobStateTimeLimitActions=actions)
    assert "jobStateTimeLimitActions[0].reason" in message and QUOTA_LIMIT in message


def test_attempt_texts_read_as_aws_writes_them(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=3)
    stack.register_node(count=3)
    done = submit(batch, "done", "QS1")
    # A rule ported from AWS: do not retry algorithm errors.
    rules = [{"action": "EXIT", "onStatusReason": "Received status from SageMaker: AlgorithmError*"}]
    broken = submit(batch, "broken", "QS1", retryStrategy={"attempts": 3, "evaluateOnExit": rules})
    wait_for(lambda: status(batch, done) == "SCHEDULED" and status(batch, broken) == "SCHEDULED")
    stack.report(done, "RUNNING")
    stack.report(done, "SUCCEEDED", exit_code=0)
    stack.report(broken, "RUNNING")
    stack.report(broken, "FAILED", exit_code=3)
    wait_for(lambda: status(batch, done) == "SUCCEEDED" and status(batch, broken) == "FAILED")
    assert reason(batch, done) == "Received status from SageMaker: Training job completed"
    described = batch.describe_service_job(jobId=broken)
    assert described["statusReason"] == "Received status from SageMaker: AlgorithmError: exited with code 3"
    assert len(described["attempts"]) == 1  # the EXIT rule matched: no retry


def test_min_runtime_makes_a_reclaim_wait_and_explain_says_until_when(stack: Stack) -> None:
    """S10.1, opt-in per share with a tag (AWS reclaims at once)."""
    batch = stack.client
    create_queue(batch, capacity=2)
    create_share(batch, "A", "LEND_AND_BORROW", limit=1, tags={"gpuquota:minRuntimeSeconds": "600"})
    create_share(batch, "B", "LEND", limit=1)
    bad = {"gpuquota:reborrowBackoffSeconds": "soon"}
    assert "whole number of seconds" in client_error(create_share, batch, "C", "LEND", limit=1, tags=bad)
    assert batch.describe_quota_share(quotaShareArn=share_arn("A"))["tags"] == {
        "gpuquota:minRuntimeSeconds": "600"
    }
    stack.register_node(count=2)
    a1, a2 = submit(batch, "a1", "A"), submit(batch, "a2", "A")
    wait_for(lambda: status(batch, a1) == "SCHEDULED" and status(batch, a2) == "SCHEDULED")
    stack.report(a2, "RUNNING")
    b1 = submit(batch, "b1", "B")
    waiting = wait_for(lambda: (e := explanation(stack, b1))["reason"] == "WAITING_FOR_MIN_RUNTIME" and e)
    assert waiting["until"] > batch.describe_service_job(jobId=a2)["scheduledAt"] + 590_000
    assert status(batch, a2) == "RUNNING"
    stack.tick_later(601)
    assert wait_for(lambda: explanation(stack, b1)["reason"] == "WAITING_FOR_PREEMPTION")
    arn = urllib.parse.quote(a2, safe="")
    last = get(stack, f"/gpuquota/v1/jobs/{arn}/explain")[2]["lastPreemption"]
    assert last["victimRuntimeMs"] >= 600_000  # S10.3: the work the preemption cost


def test_blocked_reasons_survive_a_restart(make_stack: Callable[..., Stack]) -> None:
    """The blocked state lives in the log (JobBlocked): a restarted stack shows it and acts on it."""
    first = make_stack(durable=True)
    create_queue(first.client, capacity=2)
    create_share(first.client, "B", "LEND", limit=1)
    actions = [{"reason": QUOTA_LIMIT, "state": "RUNNABLE", "maxTimeSeconds": 600, "action": "TERMINATE"}]
    first.client.update_job_queue(jobQueue="jq", jobStateTimeLimitActions=actions)
    first.register_node(count=2)
    big = submit(first.client, "big", "B", serviceRequestPayload=payload(count=2))
    blocked = wait_for(lambda: reason(first.client, big))
    second = first.reopen()
    try:
        batch = second.client
        assert wait_for(lambda: reason(batch, big)) == blocked
        second.tick_later(601)
        wait_for(lambda: status(batch, big) == "FAILED", timeout=20)
        assert reason(batch, big) == f"Terminated by JobStateTimeLimit action due to reason: {QUOTA_LIMIT}"
    finally:
        second.close()  # make_stack closes only the stacks it made
