"""The JSON Schemas under schemas/ are as strict as the wire models: what one refuses, so does the other
(issue #18). Crafted bad messages are rejected by both; good ones accepted by both."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from gpuquota.wire.export import SCHEMA_ID_PREFIX
from gpuquota.wire.inputs import INPUT_ADAPTER

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
Patch = Callable[[dict[str, Any]], None]


def schema(name: str) -> Draft202012Validator:
    document = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    return Draft202012Validator(document)


def submit() -> dict[str, Any]:
    return {
        "type": "SubmitJob",
        "schema_version": 1,
        "event_id": "e-1",
        "occurred_at": 1_700_000_000_000,
        "job": {
            "job_id": "j-1",
            "job_name": "train",
            "job_queue": "jq",
            "quota_share": "research",
            "priority": 10,
            "unit": "ml.g5.xlarge",
            "count": 2,
            "created_at": 1_700_000_000_000,
        },
    }


def priority_update() -> dict[str, Any]:
    return {
        "type": "UpdateJobPriority",
        "schema_version": 1,
        "event_id": "e-2",
        "occurred_at": 1_700_000_000_000,
        "job_id": "j-1",
        "priority": 50,
    }


def share() -> dict[str, Any]:
    return {
        "type": "CreateQuotaShare",
        "schema_version": 1,
        "event_id": "e-3",
        "occurred_at": 1,
        "spec": {
            "name": "research",
            "job_queue": "jq",
            "capacity_limits": [{"unit": "ml.g5.xlarge", "max_capacity": 2}],
            "strategy": "LEND_AND_BORROW",
        },
    }


def setter(*path: str, value: Any) -> Patch:
    def patch(message: dict[str, Any]) -> None:
        for part in path[:-1]:
            message = message[part]
        message[path[-1]] = value

    return patch


def deleter(name: str) -> Patch:
    return lambda message: message.pop(name)


BAD: dict[str, tuple[Callable[[], dict[str, Any]], Patch]] = {
    "priority 99999": (submit, setter("job", "priority", value=99999)),
    "priority -5": (submit, setter("job", "priority", value=-5)),
    "update to priority 99999": (priority_update, setter("priority", value=99999)),
    "update to priority -5": (priority_update, setter("priority", value=-5)),
    "priority as text": (priority_update, setter("priority", value="high")),
    "missing type": (submit, deleter("type")),
    "missing schema_version": (submit, deleter("schema_version")),
    "schema_version 2": (submit, setter("schema_version", value=2)),
    "unknown type": (submit, setter("type", value="LaunchRockets")),
    "missing event_id": (submit, deleter("event_id")),
    "empty event_id": (submit, setter("event_id", value="")),
    "negative occurred_at": (submit, setter("occurred_at", value=-1)),
    "unknown field": (submit, setter("colour", value="blue")),
    "zero instances": (submit, setter("job", "count", value=0)),
    "queue name with a space": (submit, setter("job", "job_queue", value="my queue")),
    "unknown strategy": (share, setter("spec", "strategy", value="STEAL")),
    "six capacity limits": (
        share,
        setter("spec", "capacity_limits", value=[{"unit": "u", "max_capacity": 1}] * 6),
    ),
}


@pytest.mark.parametrize("make", [submit, priority_update, share], ids=lambda f: f.__name__)
def test_good_inputs_pass_the_schema_and_the_wire_model(make: Callable[[], dict[str, Any]]) -> None:
    message = make()
    schema("scheduler-input.json").validate(message)
    schema(f"{message['type']}.v1.json").validate(message)
    INPUT_ADAPTER.validate_python(message)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs_fail_the_schema_and_the_wire_model(case: str) -> None:
    make, patch = BAD[case]
    message = make()
    patch(message)

    assert list(schema("scheduler-input.json").iter_errors(message)), f"the schema accepts {case}"
    if case != "missing schema_version":  # the model defaults it; producers must send it (I4)
        with pytest.raises(ValidationError):
            INPUT_ADAPTER.validate_python(message)


def test_every_schema_is_valid_draft_2020_12_with_an_id_and_requires_type() -> None:
    for path in sorted(SCHEMAS.glob("*.json")):
        if path.name == "topics.json":
            continue
        document = json.loads(path.read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(document)
        assert document["$id"] == SCHEMA_ID_PREFIX + path.name
        if path.name[0].isupper():  # one message type
            assert {"type", "schema_version", "event_id", "occurred_at"} <= set(document["required"]), path


def test_ids_derived_from_the_longest_input_id_still_fit() -> None:
    """A producer's input id of the maximum length must not make its events or node commands invalid
    (they extend it: ``<input>/<n>``, ``<event>/<node>``); one longer is refused at the edge."""
    from gpuquota.wire.base import INPUT_ID_MAX
    from gpuquota.wire.inputs import SubmitJob
    from gpuquota.wire.node_commands import RunAttempt

    longest = "i" * INPUT_ID_MAX
    node = "n" * 256
    RunAttempt(
        event_id=f"{longest}/99999/{node}",
        occurred_at=0,
        node_id=node,
        job_id="j",
        job_name="j",
        attempt_id="j#1",
        attempt_number=1,
        unit="ml.g5.xlarge",
        slots=(0,),
        gpus=(),
        payload="{}",
    )
    with pytest.raises(ValidationError, match="event_id"):
        SubmitJob.model_validate({"event_id": longest + "i", "occurred_at": 0, "spec": {}})
