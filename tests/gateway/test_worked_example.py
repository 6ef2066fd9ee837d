"""S8, the AWS notebook's worked example, through unmodified boto3 against the embedded stack."""

from __future__ import annotations

from typing import Any

from tests.gateway.conftest import Stack
from tests.gateway.helpers import status, submit, worked_example


def statuses(batch: Any, jobs: dict[str, str]) -> dict[str, str]:
    return {name: status(batch, job_id) for name, job_id in jobs.items()}


def test_worked_example_through_boto3(stack: Stack, batch: Any) -> None:
    worked_example(batch)
    stack.register_node("node-1", count=3)
    jobs: dict[str, str] = {}

    # 1. high runs in quota, med borrows QS2's idle instance, low waits (QS3 is RESERVE).
    for name, priority in (("qs1_job_high", 3), ("qs1_job_med", 2), ("qs1_job_low", 1)):
        jobs[name] = submit(batch, name, "QS1", priority)
    assert statuses(batch, jobs) == {
        "qs1_job_high": "SCHEDULED",
        "qs1_job_med": "SCHEDULED",
        "qs1_job_low": "RUNNABLE",
    }
    for name in ("qs1_job_high", "qs1_job_med"):
        stack.report(jobs[name], "STARTING")
        assert status(batch, jobs[name]) == "STARTING"
        stack.report(jobs[name], "RUNNING")
    high = batch.describe_service_job(jobId=jobs["qs1_job_high"])
    assert high["status"] == "RUNNING" and high["startedAt"] >= high["scheduledAt"] >= high["createdAt"]
    assert high["capacityUsage"] == [{"capacityUnit": "ml.g5.xlarge", "quantity": 1.0}]
    assert high["latestAttempt"]["serviceResourceId"]["name"] == "TrainingJobArn"
    assert "preemptionSummary" not in high

    # 2. qs2_job_1 reclaims QS2's instance: med is preempted, back to RUNNABLE once its node stops it.
    jobs["qs2_job_1"] = submit(batch, "qs2_job_1", "QS2", 1)
    assert status(batch, jobs["qs2_job_1"]) == "RUNNABLE"
    assert status(batch, jobs["qs1_job_med"]) == "RUNNING"  # stopping: it holds its instance until stopped
    stack.report(jobs["qs1_job_med"], "STOPPED")
    assert statuses(batch, {k: jobs[k] for k in ("qs1_job_med", "qs2_job_1")}) == {
        "qs1_job_med": "RUNNABLE",
        "qs2_job_1": "SCHEDULED",
    }
    med = batch.describe_service_job(jobId=jobs["qs1_job_med"])
    assert med["preemptionSummary"]["preemptedAttemptCount"] == 1
    recent = med["preemptionSummary"]["recentPreemptedAttempts"]
    assert len(recent) == 1 and recent[0]["serviceResourceId"] == med["attempts"][0]["serviceResourceId"]
    assert recent[0]["stoppedAt"] >= recent[0]["startedAt"]
    assert "Preempted" in med["statusReason"]
    stack.report(jobs["qs2_job_1"], "STARTING")
    stack.report(jobs["qs2_job_1"], "RUNNING")

    # 3. Raising low to 4 preempts high in-share; low runs; med stays RUNNABLE.
    updated = batch.update_service_job(jobId=jobs["qs1_job_low"], schedulingPriority=4)
    assert updated["jobId"] == jobs["qs1_job_low"]
    stack.report(jobs["qs1_job_high"], "STOPPED")
    assert statuses(batch, jobs) == {
        "qs1_job_high": "RUNNABLE",
        "qs1_job_med": "RUNNABLE",
        "qs1_job_low": "SCHEDULED",
        "qs2_job_1": "RUNNING",
    }
    high = batch.describe_service_job(jobId=jobs["qs1_job_high"])
    assert high["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert high[
        "statusReason"
    ] == "Preempted (in-share): higher priority job qs1_job_low (priority 4 > 3)".replace(
        "qs1_job_low", jobs["qs1_job_low"]
    )
    low = batch.describe_service_job(jobId=jobs["qs1_job_low"])
    assert low["schedulingPriority"] == 4

    # The snapshot shows the per-share fronts and utilisation.
    snap = batch.get_job_queue_snapshot(jobQueue="jq")
    fronts = snap["frontOfQuotaShares"]["quotaShares"]
    assert list(fronts) == ["QS1"]
    assert fronts["QS1"][0]["jobArn"].endswith(jobs["qs1_job_high"])
    assert [j["jobArn"].rsplit("/", 1)[1] for j in snap["frontOfQueue"]["jobs"]] == [
        jobs["qs1_job_high"],
        jobs["qs1_job_med"],
    ]
    usage = {
        row["quotaShareName"]: row["capacityUsage"]
        for row in snap["queueUtilization"]["quotaShareUtilization"]["topCapacityUtilization"]
    }
    assert usage == {
        "QS1": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1.0}],
        "QS2": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1.0}],
        "QS3": [],
    }
    assert snap["queueUtilization"]["totalCapacityUsage"] == [
        {"capacityUnit": "ml.g5.xlarge", "quantity": 2.0}
    ]

    # Finishing: low succeeds, its instance goes to the front of QS1 (high).
    stack.report(jobs["qs1_job_low"], "STARTING")
    stack.report(jobs["qs1_job_low"], "RUNNING")
    stack.report(jobs["qs1_job_low"], "SUCCEEDED")
    low = batch.describe_service_job(jobId=jobs["qs1_job_low"])
    assert low["status"] == "SUCCEEDED" and low["stoppedAt"] >= low["startedAt"]
    assert low["attempts"][-1]["stoppedAt"] == low["stoppedAt"]
    assert status(batch, jobs["qs1_job_high"]) == "SCHEDULED"
    assert len(batch.describe_service_job(jobId=jobs["qs1_job_high"])["attempts"]) == 2
