"""The core handles every wire message, and every event it decides survives JSON (S7.6's premise)."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from gpuquota.core.decide import handled_input_types
from gpuquota.core.evolve import handled_event_types
from gpuquota.wire.events import EVENT_ADAPTER, SchedulerEvent
from gpuquota.wire.inputs import INPUT_ADAPTER, SchedulerInput
from tests.builders import Harness
from tests.unit.core.test_checkpoints import played_with_checkpoints
from tests.unit.core.test_gangs import played_with_outputs
from tests.unit.core.test_plans import played_with_plans
from tests.unit.core.test_scenarios import CASES


def members(annotated: Any) -> set[type[Any]]:
    """The classes of an ``Annotated[A | B | ..., Field(discriminator=...)]`` union."""
    union, *_ = typing.get_args(annotated)
    return set(typing.get_args(union))


def test_every_input_type_has_a_decide_handler() -> None:
    assert members(SchedulerInput) == set(handled_input_types())


def test_every_event_type_has_an_evolve_handler() -> None:
    assert members(SchedulerEvent) == set(handled_event_types())


@pytest.fixture(scope="module")
def played() -> list[Harness]:
    """Every scenario of the table, played to its end."""
    harnesses = []
    for case in CASES.values():
        h = case.setup()
        for round_ in case.rounds:
            for action in round_.actions:
                action(h)
        harnesses.append(h)
    return [*harnesses, played_with_outputs(), played_with_checkpoints(), played_with_plans()]


def test_scenarios_produce_every_event_type(played: list[Harness]) -> None:
    produced = {type(e) for h in played for e in h.events}
    assert members(SchedulerEvent) - produced == set()


def test_every_decided_event_round_trips_through_json(played: list[Harness]) -> None:
    """The core builds events without validation (``model_construct``); JSON must still agree."""
    for h in played:
        for event in h.events:
            assert EVENT_ADAPTER.validate_json(event.model_dump_json()) == event
            assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event


def test_every_input_round_trips_through_json(played: list[Harness]) -> None:
    for h in played:
        for message in h.inputs:
            assert INPUT_ADAPTER.validate_json(message.model_dump_json()) == message
