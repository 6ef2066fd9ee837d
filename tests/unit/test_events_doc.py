"""docs/events.md is a contract for any language: every raw JSON example in it is a valid message of
its schema, and the dead letter shown is the one the scheduler writes for its original (issue #18)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpuquota.scheduler.pipeline import SourceRecord, decode
from gpuquota.wire.topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
EXAMPLES: list[dict[str, Any]] = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", DOC, re.DOTALL)]


def test_the_doc_shows_every_message_a_platform_sends_or_reads() -> None:
    shown = {example["type"] for example in EXAMPLES}
    assert {"SubmitJob", "UpdateJobPriority", "TerminateJob", "InputResult", "DeadLetter"} <= shown
    job_state = next(t for t in TOPICS if t.name == "gpuquota.job-state")
    assert {m.__name__ for m in job_state.messages} <= shown
    assert {"ACCEPTED", "REJECTED"} <= {e["outcome"] for e in EXAMPLES if e["type"] == "InputResult"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e['type']}:{e['event_id'][-12:]}")
def test_every_example_validates_against_its_schema(example: dict[str, Any]) -> None:
    schema = json.loads((ROOT / "schemas" / f"{example['type']}.v1.json").read_text(encoding="utf-8"))
    Draft202012Validator(schema).validate(example)


def test_every_topic_of_the_catalogue_is_in_the_table() -> None:
    for topic in TOPICS:
        assert f"| `{topic.name}` | {topic.key} |" in DOC, topic.name


def test_the_dead_letter_example_has_the_reason_the_scheduler_gives() -> None:
    (letter,) = [e for e in EXAMPLES if e["type"] == "DeadLetter"]
    record = SourceRecord(
        letter["topic"], letter["partition"], letter["offset"], b"default", letter["original"].encode()
    )
    assert decode(record, "default") == letter["reason"]
