"""Training plans (S11) outside the core: the ``apply`` section, ``up --nodes`` syntax, the read model's
GPU-hours and ``gpuquota plans``' rows."""

from __future__ import annotations

import pytest

from gpuquota.ctl.api import CliError
from gpuquota.ctl.apply_doc import parse
from gpuquota.ctl.plans import row
from gpuquota.ctl.render import Style
from gpuquota.entrypoints.embedded import node_plans
from gpuquota.node_agent.slots import SlotSpecError, parse_node_groups
from gpuquota.read.model import ReadModel
from tests.builders import job
from tests.unit.core.test_plans import CLOSES, START, opted_in

BASE = {
    "serviceEnvironment": {"name": "se", "capacityLimits": {"ml.g5.xlarge": 2}},
    "jobQueue": {"name": "jq", "schedulingPolicy": "p"},
}


def test_the_apply_section_takes_iso_times_and_a_share_map() -> None:
    plan = {
        "name": "p1",
        "capacityUnit": "ml.g5.xlarge",
        "count": 2,
        "windows": [{"start": "1970-01-01T00:00:01Z", "end": 5000}],
        "allocations": {"QS1": 2},
    }
    doc = parse({**BASE, "trainingPlans": [plan]})
    body = doc.plan_request(doc.trainingPlans[0])
    assert body["windows"] == [{"start": 1000, "end": 5000}] and body["gracePeriodSeconds"] == 120
    assert body["allocations"] == [{"jobQueue": "jq", "quotaShare": "QS1", "count": 2}]
    with pytest.raises(CliError, match="more than the plan's count"):
        parse({**BASE, "trainingPlans": [{**plan, "allocations": {"QS1": 3}}]})
    with pytest.raises(CliError, match="not an ISO 8601 time"):
        parse({**BASE, "trainingPlans": [{**plan, "windows": [{"start": "soon", "end": 5}]}]})


def test_up_nodes_name_a_plan_after_an_at() -> None:
    assert parse_node_groups("ml.g5.xlarge=2x2@p1") == [("ml.g5.xlarge", 2, 2)]
    assert node_plans("ml.g5.xlarge=1,ml.g5.xlarge=1x2@p1") == {"local-2": "p1", "local-3": "p1"}
    with pytest.raises(SlotSpecError):
        parse_node_groups("ml.g5.xlarge=1@")


def test_the_read_model_counts_the_plans_gpu_hours_from_the_log() -> None:
    h = opted_in()
    at_start = START - h.now - 1
    h.tick(at_start)
    h.submit(*(job(f"g{i}").share("QS1") for i in range(1, 5)))  # two of them on the plan's node
    h.tick(CLOSES - h.now - 1)
    read_model = ReadModel()
    for event in h.events:
        read_model.apply(event)
    (listed,) = read_model.plans.describe(CLOSES)
    hours = (CLOSES - START) / 3_600_000
    assert listed["openWindow"] is None and listed["nodes"] == ["plan-0"]
    assert listed["usedGpuHours"] == pytest.approx(2 * hours, abs=0.002)  # both slots, the whole window
    assert listed["idleGpuHours"] == pytest.approx(0, abs=0.002)
    cells = row(listed, Style(False), CLOSES)
    assert cells[0] == "p1" and cells[4] == "ended" and cells[5] == "QS1=2"
