"""Every Describe and List answer is the same after a restart (issue #11): it is rebuilt from the log.

The stack is restarted over its log (embedded: SQLite; distributed: a new gateway folding the pool's
log) and every answer the API gives about the resources and the jobs is compared with the one before.
A ``clientToken`` retried after the restart returns the job it made before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.gateway.conftest import Stack
from tests.gateway.helpers import submit, worked_example

STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")


def _clean(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {k: _clean(v) for k, v in answer.items() if k != "ResponseMetadata"}
    if isinstance(answer, list):
        return [_clean(v) for v in answer]
    return answer


def answers(batch: Any, job_ids: list[str]) -> dict[str, Any]:
    """Every Describe/List answer about the worked example's resources and ``job_ids``."""
    found: dict[str, Any] = {
        "policies": batch.describe_scheduling_policies(
            arns=[p["arn"] for p in batch.list_scheduling_policies()["schedulingPolicies"]]
        ),
        "environments": batch.describe_service_environments(),
        "queues": batch.describe_job_queues(),
        "shares": batch.list_quota_shares(jobQueue="jq"),
    }
    arns = [p["arn"] for p in found["policies"]["schedulingPolicies"]]
    arns += [e["serviceEnvironmentArn"] for e in found["environments"]["serviceEnvironments"]]
    arns += [q["jobQueueArn"] for q in found["queues"]["jobQueues"]]
    for share in found["shares"]["quotaShares"]:
        found[f"share {share['quotaShareName']}"] = batch.describe_quota_share(
            quotaShareArn=share["quotaShareArn"]
        )
        arns.append(share["quotaShareArn"])
    for status in STATUSES:
        found[f"list {status}"] = batch.list_service_jobs(jobQueue="jq", jobStatus=status)
    for job_id in job_ids:
        job = found[f"job {job_id}"] = batch.describe_service_job(jobId=job_id)
        arns.append(job["jobArn"])
    for arn in arns:
        found[f"tags {arn}"] = batch.list_tags_for_resource(resourceArn=arn)
    cleaned: dict[str, Any] = _clean(found)
    return cleaned


def test_every_answer_is_the_same_after_a_restart(make_stack: Callable[..., Stack]) -> None:
    first = make_stack(durable=True)
    batch = first.client
    worked_example(batch)
    first.register_node(count=3)
    done = submit(batch, "done", "QS1", tags={"team": "a"}, clientToken="token-done")
    running = submit(batch, "running", "QS2", 10, tags={"team": "b"})
    waiting = submit(batch, "waiting", "QS3", clientToken="token-waiting")
    failed = submit(batch, "failed", "QS1")
    first.report(done, "STARTING")
    first.report(done, "SUCCEEDED")
    first.report(running, "STARTING")
    first.report(running, "RUNNING")
    first.report(failed, "FAILED", exit_code=3)
    batch.terminate_service_job(jobId=waiting, reason="not needed")
    share_arn = batch.list_quota_shares(jobQueue="jq")["quotaShares"][0]["quotaShareArn"]
    batch.tag_resource(resourceArn=share_arn, tags={"owner": "ops"})
    job_arn = batch.describe_service_job(jobId=running)["jobArn"]
    batch.tag_resource(resourceArn=job_arn, tags={"stage": "2"})
    batch.untag_resource(resourceArn=job_arn, tagKeys=["team"])
    jobs = [done, running, waiting, failed]
    before = answers(batch, jobs)
    second = first.reopen()
    try:
        after = answers(second.client, jobs)
        assert after.keys() == before.keys()
        for key in before:
            assert after[key] == before[key], key
        again = submit(second.client, "done", "QS1", tags={"team": "a"}, clientToken="token-done")
        assert again == done, "a clientToken retried after a restart made a second job"
    finally:
        second.close()
