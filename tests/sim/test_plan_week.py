"""The simulator with a training plan (S11): windows open and close on the replay's ticks, the plan's
jobs are stopped at a window's close and requeued, and the report gives the plan's used and idle
GPU-hours (together: its capacity in its windows)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuquota.ctl.apply_doc import parse
from gpuquota.sim.config import configuration, load_configuration
from gpuquota.sim.engine import simulate
from gpuquota.sim.report import as_json, table
from gpuquota.sim.trace import TraceJob

EXAMPLES = Path(__file__).parents[2] / "deploy" / "examples"
G5 = "ml.g5.xlarge"
DOC = """
serviceEnvironment: {name: se, capacityLimits: {ml.g5.xlarge: 1}}
jobQueue: {name: jq, schedulingPolicy: policy}
schedulingPolicy: {name: policy}
quotaShares:
  - {name: QS1, capacityLimits: {ml.g5.xlarge: 1}, strategy: LEND_AND_BORROW}
trainingPlans:
  - name: p1
    capacityUnit: ml.g5.xlarge
    count: 1
    gracePeriodSeconds: 10
    windows: [{start: 100000, end: 200000}]
    allocations: {QS1: 1}
"""


def test_a_job_waits_for_the_window_runs_in_it_and_is_requeued_at_its_close() -> None:
    config = configuration(parse(yaml.safe_load(DOC)), "plan.yaml")
    jobs = [
        TraceJob(submitted_at=0, share="QS1", unit=G5, duration=500, job_name="a"),
        TraceJob(submitted_at=0, share="QS1", unit=G5, duration=50, job_name="b"),
        TraceJob(submitted_at=0, share="QS1", unit=G5, duration=500, job_name="c"),
    ]
    result = simulate(config, jobs, record_decisions=True)
    # a runs at once on the pool's node; b waits for the window (100 s), ends at 150 s; c then runs on
    # the plan's node until the window closes (190 s: 10 s of grace before its end), and after a ends.
    assert result.decisions == [
        ("dispatch", "j0"),
        ("dispatch", "j1"),
        ("dispatch", "j2"),
        ("preempt", "j2"),
        ("dispatch", "j2"),
    ]
    (plan,) = result.plans
    assert plan["usedGpuHours"] == round(90 / 3600, 3)  # b 50 s, c 40 s, of the 90 s the window offers
    assert plan["idleGpuHours"] == 0
    summary = as_json([result])["configurations"][0]["training_plans"]["p1"]
    assert summary == {"count": 1, "windows": 1, "gpu_hours_used": 0.025, "gpu_hours_idle": 0}
    assert "plan p1" in table([result]) and "plan GPU-hours idle" in table([result])


def test_the_example_plan_configuration_loads() -> None:
    config = load_configuration(EXAMPLES / "capacity-plan.yaml")
    (plan,) = config.plans
    assert plan.count == 16 and len(plan.windows) == 5 and plan.allocations[0].quota_share == "research"
    assert plan.allocations[0].job_queue == config.queue.name
