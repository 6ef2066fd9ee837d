"""Each rule has one home: ranges and formats in the wire models, read from there by the gateway and
``gpuquota apply``; business rules in the core (``decide``), whose rejection the gateway answers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuquota.ctl.apply_doc import ShareDoc
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params
from gpuquota.wire.base import (
    BORROW_LIMIT_RULE,
    UNITS_ONCE_RULE,
    CapacityLimit,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    ServiceEnvironmentSpec,
    Strategy,
)

LIMITS = (CapacityLimit(unit="ml.g5.xlarge", max_capacity=1),)


@pytest.mark.parametrize("strategy", [Strategy.RESERVE, Strategy.LEND])
def test_a_borrow_limit_needs_lend_and_borrow(strategy: Strategy) -> None:
    with pytest.raises(ValidationError) as refused:
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=LIMITS, strategy=strategy, borrow_limit=5)
    assert refused.value.errors()[0]["msg"] == BORROW_LIMIT_RULE
    spec = QuotaShareSpec(name="s", job_queue="q", capacity_limits=LIMITS, strategy=strategy)
    assert spec.borrow_limit == -1


def test_apply_builds_the_wire_spec() -> None:
    doc = ShareDoc(name="s", capacityLimits={"g": 2}, strategy="LEND", borrowLimit=3)
    with pytest.raises(ValidationError) as refused:
        doc.spec("q")
    assert refused.value.errors()[0]["msg"] == BORROW_LIMIT_RULE
    ok = ShareDoc(name="s", capacityLimits={"g": 2}, strategy="LEND_AND_BORROW", borrowLimit=3).spec("q")
    assert (ok.job_queue, ok.borrow_limit, ok.capacity_limits[0].max_capacity) == ("q", 3, 2)


@pytest.mark.parametrize(
    ("model", "field", "value", "message"),
    [
        (JobSpec, "priority", 10000, "schedulingPriority must be between 0 and 9999, got 10000"),
        (JobSpec, "priority", -1, "schedulingPriority must be between 0 and 9999, got -1"),
        (JobQueueSpec, "priority", 1001, "schedulingPriority must be between 0 and 1000, got 1001"),
    ],
)
def test_the_gateway_reads_ranges_from_the_wire_models(
    model: type[JobSpec | JobQueueSpec], field: str, value: int, message: str
) -> None:
    with pytest.raises(ClientException) as refused:
        Params({"schedulingPriority": value}).ranged("schedulingPriority", model, field)
    assert refused.value.message == message
    assert Params({"schedulingPriority": 7}).ranged("schedulingPriority", model, field) == 7


def test_a_spec_lists_each_unit_once() -> None:
    twice = (LIMITS[0], CapacityLimit(unit="ml.g5.xlarge", max_capacity=2))
    with pytest.raises(ValidationError) as refused:
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=twice, strategy=Strategy.LEND)
    assert refused.value.errors()[0]["msg"] == UNITS_ONCE_RULE
    with pytest.raises(ValidationError) as refused:
        ServiceEnvironmentSpec(name="e", capacity_limits=twice)
    assert refused.value.errors()[0]["msg"] == UNITS_ONCE_RULE


def test_a_share_limit_is_at_least_one() -> None:
    zero = (CapacityLimit(unit="ml.g5.xlarge", max_capacity=0),)
    with pytest.raises(ValidationError) as refused:
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=zero, strategy=Strategy.LEND)
    assert refused.value.errors()[0]["msg"] == "capacityLimits[0].maxCapacity must be at least 1, got 0"
    assert ServiceEnvironmentSpec(name="e", capacity_limits=zero).capacity_limits == zero
