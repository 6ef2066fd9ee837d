"""gpuquota's own read endpoints (not AWS): ``GET /gpuquota/v1/shares`` and
``GET /gpuquota/v1/jobs/{jobId}/explain``, used by ``gpuquota shares`` and ``gpuquota explain``."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.gateway.conftest import Stack
from tests.gateway.helpers import status, submit, worked_example


def get(stack: Stack, path: str) -> tuple[int, dict[str, str], Any]:
    try:
        with urllib.request.urlopen(stack.url + path, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), json.loads(exc.read())


def step_2(stack: Stack) -> dict[str, str]:
    """S8 steps 1-2: high and qs2_job_1 run, med was preempted cross-share, low waits."""
    batch = stack.client
    worked_example(batch)
    stack.register_node(count=3)
    jobs = {n: submit(batch, n, "QS1", p) for n, p in (("high", 3), ("med", 2), ("low", 1))}
    for name in ("high", "med"):
        stack.report(jobs[name], "RUNNING")
    jobs["qs2"] = submit(batch, "qs2", "QS2", 1)
    stack.report(jobs["med"], "STOPPED")
    stack.report(jobs["qs2"], "RUNNING")
    return jobs


def test_shares(stack: Stack) -> None:
    step_2(stack)
    code, _, body = get(stack, "/gpuquota/v1/shares?queue=jq")
    assert code == 200
    rows = {row["quotaShareName"]: row for row in body["quotaShares"]}
    assert rows["QS1"] == {
        "jobQueue": "jq",
        "quotaShareName": "QS1",
        "strategy": "LEND_AND_BORROW",
        "borrowLimit": 200,
        "inSharePreemption": "ENABLED",
        "limits": {"ml.g5.xlarge": 1},
        "maximum": {"ml.g5.xlarge": 3},  # M(s, u): the limit and a borrowLimit of 200 % more
        "usage": {"ml.g5.xlarge": 1},
        "borrowed": {},
        "lent": {},
        "runnable": 2,
        "state": "ENABLED",
        "status": "VALID",
        "hygiene": {},
    }
    assert rows["QS2"]["usage"] == {"ml.g5.xlarge": 1} and rows["QS2"]["borrowLimit"] is None
    assert get(stack, "/gpuquota/v1/shares")[2] == body  # every queue

    code, headers, error = get(stack, "/gpuquota/v1/shares?queue=nope")
    assert (code, headers["x-amzn-ErrorType"], error) == (
        400,
        "ClientException",
        {"message": "Job queue nope does not exist"},
    )


def test_lent_is_attributed_to_idle_lending_shares(stack: Stack) -> None:
    batch = stack.client
    worked_example(batch)
    stack.register_node(count=3)
    for name, priority in (("a", 3), ("b", 2)):
        submit(batch, name, "QS1", priority)
    rows = {r["quotaShareName"]: r for r in get(stack, "/gpuquota/v1/shares")[2]["quotaShares"]}
    assert (rows["QS1"]["borrowed"], rows["QS2"]["lent"], rows["QS3"]["lent"]) == (
        {"ml.g5.xlarge": 1},
        {"ml.g5.xlarge": 1},
        {},
    )


def test_explain_a_preempted_job(stack: Stack) -> None:
    jobs = step_2(stack)
    arn = urllib.parse.quote(f"arn:aws:batch:us-east-1:000000000000:service-job/{jobs['med']}", safe="")
    code, _, body = get(stack, f"/gpuquota/v1/jobs/{arn}/explain")
    assert code == 200
    assert body["jobId"] == jobs["med"] and body["status"] == "RUNNABLE"
    assert body["explanation"]["reason"] == "IDLE_CAPACITY_RESERVED"
    assert body["explanation"]["position"] == 0
    assert body["explanation"]["shareHeadName"] == "med"
    assert body["preemptedAttemptCount"] == 1
    last = body["lastPreemption"]
    assert last == body["preemptions"][0]
    assert last["kind"] == "CROSS_SHARE"
    assert (last["preemptorJobId"], last["preemptorJobName"]) == (jobs["qs2"], "qs2")
    assert last["statusReason"].startswith("Preempted (cross-share): capacity reclaimed by quota share QS2")
    assert [h["status"] for h in body["history"]] == [
        "SUBMITTED",
        "RUNNABLE",
        "SCHEDULED",
        "RUNNING",
        "RUNNABLE",
    ]
    assert last["decidedAt"] <= body["history"][-1]["at"]

    low = get(stack, f"/gpuquota/v1/jobs/{jobs['low']}/explain")[2]
    assert low["explanation"]["reason"] == "BEHIND_SHARE_HEAD"
    assert low["explanation"]["shareHead"] == jobs["med"]
    assert low["lastPreemption"] is None and low["preemptions"] == []

    code, _, error = get(stack, "/gpuquota/v1/jobs/nope/explain")
    assert (code, error) == (400, {"message": "Service job nope does not exist"})


def test_explain_without_the_core_and_for_finished_jobs(stack: Stack) -> None:
    jobs = step_2(stack)
    stack.client.terminate_service_job(jobId=jobs["low"], reason="gone")
    low = get(stack, f"/gpuquota/v1/jobs/{jobs['low']}/explain")[2]
    assert (low["status"], low["statusReason"], low["explanation"]) == ("FAILED", "gone", None)
    assert stack.gateway is not None
    stack.gateway.explainer = None  # a gateway without the core's state
    med = get(stack, f"/gpuquota/v1/jobs/{jobs['med']}/explain")[2]
    assert med["explanation"] is None and med["lastPreemption"]["kind"] == "CROSS_SHARE"


def test_preemptions_and_history_survive_a_restart(make_stack: Callable[..., Stack]) -> None:
    first = make_stack(durable=True)
    jobs = step_2(first)
    before = get(first, f"/gpuquota/v1/jobs/{jobs['med']}/explain")[2]
    shares = get(first, "/gpuquota/v1/shares")[2]
    second = first.reopen()
    try:
        after = get(second, f"/gpuquota/v1/jobs/{jobs['med']}/explain")[2]
        for data in (before, after):  # the start estimate depends on the time it is asked
            assert data["explanation"].pop("startEstimate")["estimatedAt"] > 0
        assert after == before
        assert get(second, "/gpuquota/v1/shares")[2] == shares
        assert status(second.client, jobs["med"]) == "RUNNABLE"
    finally:
        second.close()
