"""``gpuquota shares disable|enable|delete`` and ``gpuquota queues ...`` (issue #28), and the marker of
a share left above its maximum after its limit was lowered (or its borrowing ended)."""

from __future__ import annotations

import json
from typing import Any

from tests.cli.conftest import Cli, play_worked_example
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import status, submit, worked_example


def test_a_share_is_disabled_refused_deletion_while_enabled_and_deleted(stack: StackThread, cli: Cli) -> None:
    batch: Any = stack.client
    jobs = play_worked_example(stack)
    refused = cli("shares", "delete", "QS2")
    assert refused.rc == 1
    assert refused.err == (
        "gpuquota shares delete: Quota share QS2 must be DISABLED before it is deleted"
        " (first: gpuquota shares disable QS2 --queue jq)\n"
    )
    disabled = cli("shares", "disable", "QS2")
    assert disabled.rc == 0, disabled.err
    assert (
        disabled.out
        == "quota share QS2 of job queue jq: DISABLED (no new jobs; queued and running jobs go on)\n"
    )
    assert status(batch, jobs["qs2_job_1"]) == "RUNNING"
    deleted = cli("shares", "delete", "QS2", "--queue", "jq")
    assert deleted.rc == 0, deleted.err
    assert deleted.out == (
        "quota share QS2 of job queue jq: DELETING (0 queued job(s) fail, 1 running job(s) are stopped)\n"
    )
    stack.report(jobs["qs2_job_1"], "STOPPED")
    job = batch.describe_service_job(jobId=jobs["qs2_job_1"])
    assert (job["status"], job["statusReason"]) == ("FAILED", "Quota share QS2 deleted")
    missing = cli("shares", "disable", "QS2")
    assert (missing.rc, missing.err) == (1, "gpuquota shares disable: Quota share QS2 does not exist\n")


def test_queues_list_disable_enable_delete(stack: StackThread, cli: Cli) -> None:
    worked_example(stack.client)
    listed = cli("queues")
    assert listed.rc == 0, listed.err
    header, row = (line.split() for line in listed.out.strip().splitlines())
    assert header == ["QUEUE", "STATE", "STATUS", "PRIORITY", "POLICY", "ENVIRONMENT", "SHARES"]
    assert row[0:3] == ["jq", "ENABLED", "VALID"] and row[-1] == "3"
    refused = cli("queues", "delete", "jq")
    assert refused.rc == 1 and "(first: gpuquota queues disable jq)" in refused.err
    assert cli("queues", "disable", "jq").out.startswith("job queue jq: DISABLED")
    assert cli("queues", "enable", "jq").out.startswith("job queue jq: ENABLED")
    assert cli("queues", "disable", "jq").rc == 0
    deleted = cli("queues", "delete", "jq", "-o", "json")
    assert deleted.rc == 0, deleted.err
    assert json.loads(deleted.out)["quotaShares"] == ["QS1", "QS2", "QS3"]
    assert json.loads(cli("queues", "list", "-o", "json").out) == {"jobQueues": []}


def test_shares_mark_a_share_above_its_maximum(stack: StackThread, cli: Cli) -> None:
    batch: Any = stack.client
    worked_example(batch)
    stack.register_node("node-1", count=3)
    for name in ("a", "b"):
        job = submit(batch, name, "QS1")  # its own instance, then QS2's idle one
        stack.report(job, "STARTING")
        stack.report(job, "RUNNING")
    assert "above its maximum" not in cli("shares").out
    arn = next(
        s["quotaShareArn"]
        for s in batch.list_quota_shares(jobQueue="jq")["quotaShares"]
        if s["quotaShareName"] == "QS1"
    )
    # its limit stays 1, but without borrowing its maximum is 1 too: the two running jobs go on
    batch.update_quota_share(quotaShareArn=arn, resourceSharingConfiguration={"strategy": "LEND"})
    table = cli("shares")
    assert table.rc == 0, table.err
    row = next(line.split() for line in table.out.splitlines() if line.split()[:1] == ["QS1"])
    assert row[2] == "1" and row[3] == "2*"  # LIMIT, USED
    assert table.out.rstrip().endswith(
        "* QS1 above its maximum: 2/1 ml.g5.xlarge (limit lowered; running jobs finish, no new ones start)"
    )
    rows = json.loads(cli("shares", "-o", "json").out)["quotaShares"]
    assert next(r for r in rows if r["quotaShareName"] == "QS1")["maximum"] == {"ml.g5.xlarge": 1}
