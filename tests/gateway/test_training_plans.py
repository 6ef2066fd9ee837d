"""Training plans (S11) through boto3 and gpuquota's plan endpoints, in both modes.

The tests play the node agents (``stack.register_node``-style inputs, one node of the plan) and the
clock (``tick_at``: a ``Tick`` stamped at a given time, decided like any other input), so a window
opens and closes when the test says, in embedded and distributed mode alike.
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from typing import Any

from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer
from tests.gateway.conftest import Stack, wait_for
from tests.gateway.helpers import G5, create_queue, create_share, payload, status, submit
from tests.gateway.test_gpuquota_endpoints import get

GRACE = 10
ENDED = "Preempted (training plan p1 window ended)"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def put_plan(stack: Stack, **fields: Any) -> dict[str, Any]:
    body = {
        "trainingPlanName": "p1",
        "serviceEnvironment": "se",
        "capacityUnit": G5,
        "count": 2,
        "gracePeriodSeconds": GRACE,
        **fields,
    }
    request = urllib.request.Request(
        stack.url + "/gpuquota/v1/plans",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def plans(stack: Stack) -> dict[str, dict[str, Any]]:
    code, _, body = get(stack, "/gpuquota/v1/plans")
    assert code == 200, body
    return {p["trainingPlanName"]: p for p in body["trainingPlans"]}


def register_nodes(stack: Stack, plain: int = 1, planned: int = 2) -> None:
    """node-1 with ``plain`` g5 slots, and plan-1 of plan p1 with ``planned``."""
    stack.register_node("node-1", count=plain)
    slots = tuple(SlotOffer(unit=G5, gpus=(10 + i,)) for i in range(planned))
    stack.feed(inp.RegisterNode, node_id="plan-1", pool=stack.pool, slots=slots, training_plan="p1")


def tick_at(stack: Stack, at: int) -> None:
    """A tick stamped ``at`` (epoch ms), every online node heartbeating just before it."""
    for node_id in sorted(n.node_id for n in stack.state.nodes.values() if n.online):
        stack.feed(inp.NodeHeartbeat, node_id=node_id, occurred_at=at)
    stack.feed(inp.Tick, occurred_at=at)


def node_of(stack: Stack, job_id: str) -> str | None:
    record = stack.state.jobs.get(job_id)
    return None if record is None or not record.placements else record.placements[0].node_id


def opened(stack: Stack, is_open: bool) -> dict[str, Any]:
    """Plan p1 as listed once its window is (or is not) open; empty until then."""
    plan = plans(stack)["p1"]
    return plan if (plan["openWindow"] is not None) is is_open else {}


def has_status(batch: Any, job_id: str, wanted: str) -> bool:
    return status(batch, job_id) == wanted


def stopping(stack: Stack, job_id: str) -> bool:
    return stack.state.jobs[job_id].stop is not None


def test_a_window_opens_its_jobs_start_and_its_end_requeues_them(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch, capacity=1)
    create_share(batch, "QS1", "LEND_AND_BORROW", limit=1)
    register_nodes(stack)
    start = now_ms() + 60_000
    end = start + 600_000
    answer = put_plan(
        stack,
        windows=[{"start": start, "end": end}],
        allocations=[{"jobQueue": "jq", "quotaShare": "QS1", "count": 2}],
    )
    assert answer["openWindow"] is None and answer["nodes"] == ["plan-1"]
    jobs = [submit(batch, f"j{i}", "QS1") for i in range(3)]
    wait_for(lambda: status(batch, jobs[0]) == "SCHEDULED", timeout=20)
    assert [status(batch, j) for j in jobs[1:]] == ["RUNNABLE", "RUNNABLE"]
    code, _, explained = get(stack, f"/gpuquota/v1/jobs/{jobs[1]}/explain")
    if explained["explanation"] is not None:  # the gateway sees the core's state
        assert explained["explanation"]["reason"] == "WAITING_FOR_TRAINING_PLAN"
        assert f"waits for training plan p1 from {start}" in explained["explanation"]["message"]

    # The window opens with the first tick inside it: its allocation raises QS1's limit to 3.
    tick_at(stack, start + 1)
    wait_for(lambda: all(status(batch, j) == "SCHEDULED" for j in jobs[1:]), timeout=20)
    assert {node_of(stack, j) for j in jobs[1:]} == {"plan-1"}
    listed = wait_for(lambda: opened(stack, True))
    assert listed["openWindow"] == {"start": start, "end": end}
    for job_id in jobs[1:]:
        stack.report(job_id, "STARTING")
        stack.report(job_id, "RUNNING")
    # The console: the plan's allocation on QS1's bar, its table, and its window on a job's timeline.
    _, _, overview = get(stack, "/console/api/overview")
    (qs1,) = [row for row in overview["shares"] if row["quotaShareName"] == "QS1"]
    assert qs1["planned"] == {G5: 2} and overview["plans"][0]["trainingPlanName"] == "p1"
    _, _, page = get(stack, f"/console/api/jobs/{jobs[1]}")
    assert page["planWindows"] == [{"trainingPlanName": "p1", "start": start, "end": end, "count": 2}]

    # A grace period before the end, the plan's jobs are stopped (SIGTERM, then SIGKILL after the
    # grace) and requeued with the plan's reason once their node reports them stopped (a tick a
    # millisecond earlier stops nothing: tests/unit/core/test_plans.py; here it would go unrecorded).
    assert all(stack.state.jobs[j].stop is None for j in jobs[1:])
    tick_at(stack, end - GRACE * 1000)
    for job_id in jobs[1:]:
        wait_for(functools.partial(stopping, stack, job_id), timeout=20)
        stack.report(job_id, "STOPPED")
    for job_id in jobs[1:]:
        wait_for(functools.partial(has_status, batch, job_id, "RUNNABLE"), timeout=20)
        described = batch.describe_service_job(jobId=job_id)
        assert described["statusReason"] == ENDED
        assert described["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert status(batch, jobs[0]) == "SCHEDULED"  # on the plain node: not the plan's
    final = wait_for(lambda: opened(stack, False))
    assert final["usedGpuHours"] > 0 and final["idleGpuHours"] >= 0


def test_a_borrower_that_does_not_end_before_the_window_closes_waits(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch, capacity=1)
    create_share(batch, "QS1", "LEND", limit=1)
    create_share(batch, "QS2", "LEND_AND_BORROW", limit=1)
    register_nodes(stack, plain=2)
    start = now_ms() - 1_000
    put_plan(stack, windows=[{"start": start, "end": start + 900_000}], gracePeriodSeconds=120)
    wait_for(lambda: plans(stack)["p1"]["openWindow"] is not None, timeout=20)
    first = submit(batch, "k1", "QS2")  # in quota
    second = submit(batch, "k2", "QS2")  # borrows QS1's idle instance, on node-1 too
    wait_for(lambda: status(batch, first) == "SCHEDULED" and status(batch, second) == "SCHEDULED", timeout=20)
    assert {node_of(stack, first), node_of(stack, second)} == {"node-1"}

    # Only the plan's node is left: a borrower that could run past the window's close waits ...
    too_long = submit(
        batch, "k3", "QS2", timeoutConfig={"attemptDurationSeconds": 3600}, serviceRequestPayload=payload()
    )
    wait_for(lambda: too_long in stack.state.jobs, timeout=20)  # decided: accepted, and not placed
    assert status(batch, too_long) == "RUNNABLE" and not stack.state.jobs[too_long].placements
    batch.terminate_service_job(jobId=too_long, reason="does not fit the window")
    wait_for(lambda: status(batch, too_long) == "FAILED", timeout=20)

    # ... and one that ends before it runs there.
    fits = submit(batch, "k4", "QS2", timeoutConfig={"attemptDurationSeconds": 60})
    wait_for(lambda: status(batch, fits) == "SCHEDULED", timeout=20)
    assert node_of(stack, fits) == "plan-1"
