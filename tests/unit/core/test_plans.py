"""Training plans (S11): windows open and close with ticks, allocations raise limits, the plan's jobs
are preempted a grace period before a window ends, borrowers must fit before it closes; replay."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota.core import decide, evolve, explain, fingerprint, replay
from gpuquota.core.plans import STOP_AT_PLAN_END_TAG
from gpuquota.scheduler.commands import node_commands
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import PlanAllocation, PlanWindow, SlotOffer, TrainingPlanSpec
from gpuquota.wire.node_commands import StopAttempt
from tests.builders import G5, Harness, job, share

START, END, GRACE = 1_100_000, 1_200_000, 10
"""The harness's clock starts at 1_000_000 ms: the window opens 100 s later and lasts 100 s."""
CLOSES = END - GRACE * 1000


def plan(allocations: tuple[tuple[str, int], ...] = (("QS1", 2),), **fields: Any) -> TrainingPlanSpec:
    values: dict[str, Any] = {
        "name": "p1",
        "service_environment": "se",
        "unit": G5,
        "count": 2,
        "windows": (PlanWindow(start=START, end=END),),
        "allocations": tuple(PlanAllocation(job_queue="jq", quota_share=s, count=c) for s, c in allocations),
        "grace_seconds": GRACE,
    }
    values.update(fields)
    return TrainingPlanSpec(**values)


def harness(*shares: Any, allocations: tuple[tuple[str, int], ...] = (("QS1", 2),)) -> Harness:
    """SE g5 x 2 on node-0, plus node plan-0 (2 g5) of plan p1; QS1 LEND_AND_BORROW 1, QS2 LEND 1."""
    h = Harness.basic(capacity=2, nodes=1)
    h.with_shares(*(shares or (share("QS1").limit(1).lend_and_borrow(), share("QS2").limit(1).lend())))
    slots = (SlotOffer(unit=G5, gpus=(10,)), SlotOffer(unit=G5, gpus=(11,)))
    h.feed(inp.RegisterNode, node_id="plan-0", slots=slots, training_plan="p1")
    (changed,) = h.feed(inp.PutTrainingPlan, spec=plan(allocations))
    assert isinstance(changed, ev.TrainingPlanChanged)
    return h


def at(h: Harness, when: int) -> Harness:
    return h.tick(when - h.now - 1)  # ``feed`` adds 1 ms


def test_plan_nodes_are_unusable_outside_windows_and_open_with_the_first_tick_inside() -> None:
    h = harness()
    h.submit(job("a1").share("QS1"), job("a2").share("QS1"), job("a3").share("QS1"))
    # a1 in quota, a2 borrows QS2's idle instance; a3 waits: the plan node is closed, maxCapacity 2
    assert h.statuses("a1", "a2", "a3") == {"a1": "SCHEDULED", "a2": "SCHEDULED", "a3": "RUNNABLE"}
    assert h.state.pool_slots["default"][G5] == 2 and h.state.nodes["plan-0"].plan_closed
    explained = explain(h.state, "a3", now=h.now)
    assert explained is not None and explained.reason == "WAITING_FOR_TRAINING_PLAN"
    assert f"waits for training plan p1 from {START}" in explained.message and explained.until == START
    assert h.blocked("a3") is None  # a window would let it run: it is not blocked (S9)

    at(h, START - 1)
    assert not any(isinstance(e, ev.TrainingPlanWindowOpened) for e in h.last)
    at(h, START)
    opened, *rest = h.last
    assert isinstance(opened, ev.TrainingPlanWindowOpened) and (opened.start, opened.end) == (START, END)
    assert h.state.shares[("jq", "QS1")].limits[G5] == 3  # 1 + the allocation of 2
    assert h.status("a3") == "SCHEDULED" and h.placement("a3")[0][0] == "plan-0"
    assert fingerprint(replay(h.events)) == fingerprint(h.state)


def opted_in() -> Harness:
    """QS1's borrowers may run on the plan's nodes although they are stopped when the window closes."""
    return harness(
        share("QS1").limit(1).lend_and_borrow().tag(STOP_AT_PLAN_END_TAG, "true"),
        share("QS2").limit(1).lend(),
    )


def test_the_plans_jobs_are_preempted_a_grace_period_before_the_end_and_requeued() -> None:
    h = opted_in()
    at(h, START)
    h.submit(*(job(f"b{i}").share("QS1") for i in range(1, 5)))  # 3 in quota, 1 borrows QS2's
    on_plan = sorted(j for j in ("b1", "b2", "b3", "b4") if h.placement(j)[0][0] == "plan-0")
    assert on_plan == ["b3", "b4"]  # fullest node first: node-0 (by id), then the plan's
    h.running(*on_plan)
    at(h, CLOSES - 30_000)
    checkpoint = h.now + 1  # the heartbeat's time: ``feed`` adds 1 ms
    h.feed(
        inp.NodeHeartbeat,
        node_id="plan-0",
        attempts=tuple(
            inp.NodeAttempt(job_id=j, attempt_id=f"{j}#1", status="RUNNING", checkpoint_at=checkpoint)
            for j in on_plan
        ),
    )
    at(h, CLOSES - 1)
    assert not h.preempted()
    at(h, CLOSES)
    closed = [e for e in h.last if isinstance(e, ev.TrainingPlanWindowClosed)]
    preempted = [e for e in h.last if isinstance(e, ev.JobPreempted)]
    assert len(closed) == 1 and sorted(p.job_id for p in preempted) == on_plan
    for p in preempted:
        assert p.kind == "TRAINING_PLAN" and p.preemptor_job_id == ""
        assert p.status_reason == "Preempted (training plan p1 window ended)"
        assert p.lost_ms == CLOSES - checkpoint  # S12's rule: since the last checkpoint
        assert p.grace_seconds == GRACE
    assert h.state.shares[("jq", "QS1")].limits[G5] == 1 and h.state.nodes["plan-0"].plan_closed
    assert h.state.pool_slots["default"][G5] == 2

    h.stopped(*on_plan)
    for j in on_plan:
        assert h.status(j) == "RUNNABLE"
        assert h.reason(j) == "Preempted (training plan p1 window ended)"
        assert h.record(j).preempted_count == 1
    assert fingerprint(replay(h.events)) == fingerprint(h.state)


def test_the_stop_reaches_the_node_with_the_plans_grace() -> None:
    h = opted_in()
    at(h, START)
    h.submit(*(job(f"c{i}").share("QS1") for i in range(1, 5)))
    at(h, CLOSES - 1)
    commands: list[StopAttempt] = []
    for event in decide(h.state, inp.Tick(event_id="tick-x", occurred_at=CLOSES)):
        commands += [c for c in node_commands(h.state, event) if isinstance(c, StopAttempt)]
        evolve(h.state, event)
    assert commands and all(c.grace_seconds == GRACE and c.node_id == "plan-0" for c in commands)


@pytest.mark.parametrize(
    ("timeout", "tag", "on_plan"),
    [
        (None, None, False),  # no attemptDurationSeconds: it might run past the window
        (200, None, False),  # ends after the window closes
        (50, None, True),  # ends before it closes
        (None, "true", True),  # its share accepts being stopped at the end
    ],
    ids=["no-timeout", "too-long", "fits", "opted-in"],
)
def test_a_borrower_goes_on_plan_capacity_only_if_it_ends_before_the_window_closes(
    timeout: int | None, tag: str | None, on_plan: bool
) -> None:
    borrower = share("QS2").limit(1).lend_and_borrow()
    if tag is not None:
        borrower = borrower.tag(STOP_AT_PLAN_END_TAG, tag)
    h = harness(share("QS1").limit(1).lend(), borrower, allocations=())
    at(h, START)
    h.submit(job("d1").share("QS2"), job("d2").share("QS2"))  # in quota, then borrows QS1's idle one
    builder = job("d3").share("QS2")
    if timeout is not None:
        builder = builder.timeout(timeout)
    h.submit(builder)  # node-0 is full: only the plan node is left, the plan's unallocated capacity
    assert (h.status("d3") == "SCHEDULED") is on_plan
    if on_plan:
        assert h.placement("d3")[0][0] == "plan-0"


def test_an_invalid_plan_is_rejected_and_deleting_an_open_plan_stops_its_jobs() -> None:
    h = harness()
    h.feed(inp.PutTrainingPlan, spec=plan(service_environment="nope"))
    assert h.rejections() == ["Service environment nope does not exist"]
    h.feed(inp.PutTrainingPlan, spec=plan((("QS9", 1),)))
    assert h.rejections() == ["Quota share QS9 does not exist in job queue jq"]
    with pytest.raises(ValueError, match="more than the plan's count"):
        plan((("QS1", 2), ("QS2", 1)))
    with pytest.raises(ValueError, match="must end after it starts"):
        plan(windows=(PlanWindow(start=5, end=5),))

    at(h, START)
    h.submit(job("e1").share("QS1"), job("e2").share("QS1"), job("e3").share("QS1"))
    on_plan = [j for j in ("e1", "e2", "e3") if h.placement(j)[0][0] == "plan-0"]
    h.feed(inp.DeleteTrainingPlan, name="p1")
    assert sorted(e.job_id for e in h.last if isinstance(e, ev.JobPreempted)) == sorted(on_plan)
    assert "p1" not in h.state.plans and h.state.nodes["plan-0"].plan_closed
    h.feed(inp.DeleteTrainingPlan, name="p1")
    assert h.rejections() == ["Training plan p1 does not exist"]
    assert fingerprint(replay(h.events)) == fingerprint(h.state)


def test_a_second_window_opens_after_the_first_closed() -> None:
    windows = (PlanWindow(start=START, end=END), PlanWindow(start=END + 50_000, end=END + 150_000))
    h = Harness.basic(capacity=1, nodes=1).with_shares(share("QS1").limit(1).lend_and_borrow())
    h.feed(inp.PutTrainingPlan, spec=plan(windows=windows))
    assert "p1" not in h.state.plan_windows
    at(h, START)
    assert h.state.plan_windows["p1"] == (START, END)
    at(h, CLOSES)
    assert "p1" not in h.state.plan_windows
    at(h, END + 50_000)
    assert h.state.plan_windows["p1"] == (END + 50_000, END + 150_000)
    assert fingerprint(replay(h.events)) == fingerprint(h.state)


def test_a_share_tag_other_than_true_or_false_is_rejected() -> None:
    h = Harness.basic(capacity=1, nodes=1)
    h.share(share("QS1").limit(1).tag(STOP_AT_PLAN_END_TAG, "maybe"))
    assert h.rejections() == [f"Tag {STOP_AT_PLAN_END_TAG} must be true or false, not 'maybe'"]


def played_with_plans() -> Harness:
    """A plan put, a window opened and closed on running jobs, the plan deleted (test_contract)."""
    h = opted_in()
    at(h, START)
    h.submit(*(job(f"f{i}").share("QS1") for i in range(1, 5)))
    at(h, CLOSES)
    h.stop_all_preempted()
    h.feed(inp.DeleteTrainingPlan, name="p1")
    return h
