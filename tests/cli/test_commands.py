"""``gpuquota jobs``, ``gpuquota shares`` and ``gpuquota explain`` against an embedded stack."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli.conftest import Cli, play_worked_example
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import status, submit, worked_example


def lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_jobs_list_filters_and_json(stack: StackThread, cli: Cli) -> None:
    jobs = play_worked_example(stack)
    everything = cli("jobs", "list")
    assert everything.rc == 0 and everything.err == ""
    table = lines(everything.out)
    assert table[0][:4] == ["JOB", "ID", "NAME", "SHARE"]
    assert {row[1]: row[3] for row in table[1:]} == {
        "qs1_job_high": "RUNNING",
        "qs1_job_med": "RUNNABLE",
        "qs1_job_low": "RUNNABLE",
        "qs2_job_1": "RUNNING",
    }
    assert {row[0] for row in table[1:]} == set(jobs.values())

    runnable = cli("jobs", "list", "--status", "runnable", "--output", "json")
    assert runnable.rc == 0
    assert {j["jobName"] for j in json.loads(runnable.out)["jobs"]} == {"qs1_job_med", "qs1_job_low"}

    qs2 = json.loads(cli("jobs", "list", "--queue", "jq", "--share", "QS2", "-o", "json").out)["jobs"]
    assert [j["jobName"] for j in qs2] == ["qs2_job_1"]
    running_qs1 = cli("jobs", "list", "--share", "QS1", "--status", "RUNNING", "-o", "json")
    assert [j["jobName"] for j in json.loads(running_qs1.out)["jobs"]] == ["qs1_job_high"]
    assert cli("jobs", "list", "--share", "QS3").out.strip() == "No jobs."


def test_jobs_list_follows_every_page(stack: StackThread, cli: Cli) -> None:
    """The gateway answers at most 100 jobs a page: the list has all 101 (boto3's paginator)."""
    worked_example(stack.client)
    submitted = {submit(stack.client, f"job-{i}") for i in range(101)}
    listed = json.loads(cli("jobs", "list", "-o", "json").out)["jobs"]
    assert len(listed) == 101 and {j["jobId"] for j in listed} == submitted
    table = lines(cli("jobs", "list").out)
    assert {row[0] for row in table[1:]} == submitted


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("jobs", "list", "--queue", "nope"), "gpuquota jobs list: Job queue nope does not exist\n"),
        (("jobs", "list", "--share", "QSX"), "gpuquota jobs list: Quota share QSX does not exist\n"),
        (
            ("jobs", "list", "--queue", "jq", "--share", "QSX"),
            "gpuquota jobs list: Quota share QSX does not exist in job queue jq\n",
        ),
        (("jobs", "describe", "nope"), "gpuquota jobs describe: Service job nope does not exist\n"),
        (
            ("jobs", "update-priority", "nope", "3"),
            "gpuquota jobs update-priority: Service job nope does not exist\n",
        ),
        (("jobs", "terminate", "nope"), "gpuquota jobs terminate: Service job nope does not exist\n"),
        (("explain", "nope"), "gpuquota explain: Service job nope does not exist\n"),
        (("shares", "--queue", "nope"), "gpuquota shares: Job queue nope does not exist\n"),
    ],
)
def test_unknown_names_are_one_line_errors(
    stack: StackThread, cli: Cli, argv: tuple[str, ...], message: str
) -> None:
    play_worked_example(stack)
    result = cli(*argv)
    assert (result.rc, result.out, result.err) == (1, "", message)


def test_jobs_describe_update_priority_and_terminate(stack: StackThread, cli: Cli) -> None:
    jobs = play_worked_example(stack)
    med = jobs["qs1_job_med"]
    described = cli("jobs", "describe", med)
    assert described.rc == 0
    assert f"qs1_job_med ({med})" in described.out
    assert "Preempted (cross-share): capacity reclaimed by quota share QS2" in described.out
    assert "Preempted      1 time(s)" in described.out
    assert "Attempts" in described.out
    raw = json.loads(
        cli("jobs", "describe", f"arn:aws:batch:us-east-1:000000000000:service-job/{med}", "-o", "json").out
    )
    assert raw["jobId"] == med and raw["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert "ResponseMetadata" not in raw

    low = jobs["qs1_job_low"]
    updated = cli("jobs", "update-priority", low, "4")
    assert (updated.rc, updated.out) == (0, f"qs1_job_low ({low}): priority 1 -> 4\n")
    assert stack.client.describe_service_job(jobId=low)["schedulingPriority"] == 4
    out_of_range = cli("jobs", "update-priority", low, "10000")
    assert (out_of_range.rc, out_of_range.err) == (
        1,
        "gpuquota jobs update-priority: schedulingPriority must be between 0 and 9999, got 10000\n",
    )

    terminated = cli("jobs", "terminate", med, "--reason", "not needed")
    assert (terminated.rc, terminated.out) == (
        0,
        f"qs1_job_med ({med}): termination requested (not needed)\n",
    )
    assert status(stack.client, med) == "FAILED"
    assert stack.client.describe_service_job(jobId=med)["statusReason"] == "not needed"
    again = cli("jobs", "terminate", med, "-o", "json")
    assert again.rc == 0 and json.loads(again.out)["jobId"] == med


def test_shares_table_and_json(stack: StackThread, cli: Cli) -> None:
    batch: Any = stack.client
    jobs = play_worked_example(stack)
    result = cli("shares")
    assert result.rc == 0, result.err
    rows = lines(result.out)
    assert rows[0] == ["Job", "queue", "jq", "(instances", "of", "ml.g5.xlarge)"]
    assert rows[1] == [
        "SHARE",
        "STRATEGY",
        "LIMIT",
        "USED",
        "BORROWED",
        "LENT",
        "QUEUED",
        "PREEMPTION",
        "STATE",
    ]
    assert rows[2] == ["QS1", "LEND_AND_BORROW", "200%", "1", "1", "0", "0", "2", "in-share", "ENABLED"]
    assert rows[3] == ["QS2", "LEND", "1", "1", "0", "0", "0", "-", "ENABLED"]
    assert rows[4] == ["QS3", "RESERVE", "1", "0", "0", "0", "0", "-", "ENABLED"]

    batch.terminate_service_job(jobId=jobs["qs2_job_1"], reason="x")
    stack.report(jobs["qs2_job_1"], "STOPPED")
    # med takes QS2's instance again: QS1 borrows 1, QS2 lends 1.
    data = json.loads(cli("shares", "--queue", "jq", "-o", "json").out)["quotaShares"]
    by_name = {row["quotaShareName"]: row for row in data}
    assert by_name["QS1"]["usage"] == {"ml.g5.xlarge": 2}
    assert by_name["QS1"]["borrowed"] == {"ml.g5.xlarge": 1}
    assert by_name["QS2"]["lent"] == {"ml.g5.xlarge": 1}
    assert by_name["QS3"]["lent"] == {}
    assert by_name["QS1"]["runnable"] == 1
    assert by_name["QS1"]["borrowLimit"] == 200 and by_name["QS2"]["borrowLimit"] is None

    # S10's opt-in tags show with the share (here QS2: a minimum runtime, then a reborrow backoff)
    arn = next(
        r["quotaShareArn"]
        for r in batch.list_quota_shares(jobQueue="jq")["quotaShares"]
        if r["quotaShareName"] == "QS2"
    )
    batch.tag_resource(
        resourceArn=arn,
        tags={"gpuquota:minRuntimeSeconds": "60", "gpuquota:reborrowBackoffSeconds": "30"},
    )
    rows = lines(cli("shares").out)
    assert rows[3] == [
        "QS2",
        "LEND",
        "1",
        "0",
        "0",
        "1",
        "0",
        "min",
        "runtime",
        "60s,",
        "reborrow",
        "backoff",
        "30s",
        "ENABLED",
    ]
    data = json.loads(cli("shares", "-o", "json").out)["quotaShares"]
    assert {r["quotaShareName"]: r["hygiene"] for r in data}["QS2"] == {
        "gpuquota:minRuntimeSeconds": "60",
        "gpuquota:reborrowBackoffSeconds": "30",
    }


def test_explain_waiting_and_preempted_jobs(stack: StackThread, cli: Cli) -> None:
    jobs = play_worked_example(stack)
    low = cli("explain", jobs["qs1_job_low"])
    assert low.rc == 0, low.err
    assert "Why: BEHIND_SHARE_HEAD" in low.out
    assert "(head: qs1_job_med)" in low.out
    assert "pool capacity C(u)       3" in low.out

    med = cli("explain", jobs["qs1_job_med"])
    assert med.rc == 0
    assert "Why: IDLE_CAPACITY_RESERVED" in med.out
    assert "Last preemption (1 in all)" in med.out
    assert "kind       cross-share" in med.out
    assert f"preemptor  qs2_job_1 ({jobs['qs2_job_1']}) of share QS2" in med.out
    assert "this share's usage     2" in med.out

    data = json.loads(cli("explain", jobs["qs1_job_med"], "-o", "json").out)
    assert data["explanation"]["reason"] == "IDLE_CAPACITY_RESERVED"
    assert data["explanation"]["figures"]["reservedIdle"] == 1
    last = data["lastPreemption"]
    assert (last["kind"], last["preemptorJobName"], last["preemptorQuotaShareName"]) == (
        "CROSS_SHARE",
        "qs2_job_1",
        "QS2",
    )
    assert last["figures"] == {
        "unit": "ml.g5.xlarge",
        "preemptorDemand": 1,
        "poolCapacity": 3,
        "poolUsage": 2,
        "reservedIdle": 1,
        "held": 0,
        "preemptorShareUsage": 0,
        "preemptorShareLimit": 1,
        "victimShareUsage": 2,
        "victimShareLimit": 1,
    }
    assert [h["status"] for h in data["history"]] == [
        "SUBMITTED",
        "RUNNABLE",
        "SCHEDULED",
        "STARTING",
        "RUNNING",
        "RUNNABLE",
    ]

    high = cli("explain", jobs["qs1_job_high"])
    assert "Why: DISPATCHED" in high.out and "Last preemption" not in high.out


def test_endpoint_from_the_environment(stack: StackThread, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    play_worked_example(stack)
    monkeypatch.setenv("GPUQUOTA_ENDPOINT", stack.stack.url)
    result = cli("shares", "-o", "json", endpoint=False)
    assert result.rc == 0 and len(json.loads(result.out)["quotaShares"]) == 3


@pytest.mark.parametrize(
    "argv",
    [
        ("jobs", "list"),
        ("jobs", "describe", "x"),
        ("jobs", "update-priority", "x", "1"),
        ("jobs", "terminate", "x"),
        ("shares",),
        ("explain", "x"),
        ("apply", "-f", "deploy/examples/worked-example.yaml"),
    ],
)
def test_connection_refused(
    argv: tuple[str, ...], closed_port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuquota.entrypoints.cli import main

    assert main([*argv, "--endpoint", closed_port]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert f"cannot reach gpuquota at {closed_port}: connection refused" in captured.err


def test_invalid_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuquota.entrypoints.cli import main

    assert main(["shares", "--endpoint", "localhost:8642"]) == 1
    assert capsys.readouterr().err == (
        "gpuquota shares: invalid endpoint 'localhost:8642': expected http://HOST:PORT\n"
    )
