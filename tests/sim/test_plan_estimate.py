"""The start estimate accounts for training plans' future windows (S11): a job that waits for a window
is estimated to start when it opens, not never."""

from __future__ import annotations

from gpuquota.read.model import ReadModel
from gpuquota.sim.estimate import estimate
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import PlanAllocation, PlanWindow, SlotOffer, TrainingPlanSpec
from tests.builders import G5, Harness, job, share

START = 1_300_000


def test_a_job_waiting_for_a_window_is_estimated_to_start_when_it_opens() -> None:
    h = Harness.basic(capacity=1, nodes=1).with_shares(share("QS1").limit(1).lend_and_borrow())
    h.feed(inp.RegisterNode, node_id="plan-0", slots=(SlotOffer(unit=G5, gpus=(9,)),), training_plan="p1")
    plan = TrainingPlanSpec(
        name="p1",
        service_environment="se",
        unit=G5,
        count=1,
        windows=(PlanWindow(start=START, end=START + 3_600_000),),
        allocations=(PlanAllocation(job_queue="jq", quota_share="QS1", count=1),),
    )
    h.feed(inp.PutTrainingPlan, spec=plan)
    h.submit(job("a1").share("QS1").timeout(36_000), job("a2").share("QS1"))
    assert h.statuses("a1", "a2") == {"a1": "SCHEDULED", "a2": "RUNNABLE"}
    read_model = ReadModel()
    for event in h.events:
        read_model.apply(event)
    found = estimate(h.state, read_model, "a2", h.now)
    assert found is not None
    # a1 ends at its timeout (36 s) long before the window (300 s on): a2 starts at the earlier of the
    # two capacities, a1's instance; with a1 running forever (likely: 1 h), the window's opening.
    assert found["latestStartAt"] is not None and found["latestStartAt"] <= START
    assert found["likelyStartAt"] == START
