"""The memo of messages' JSON: the same text as pydantic's, once per object, bounded; an input's
record JSON, for the log."""

from __future__ import annotations

import json

from gpuquota.adapters import message_json as memo
from gpuquota.adapters.kafka import encode
from gpuquota.adapters.log_codec import decode_record, encode_events, encode_input
from gpuquota.scheduler.records import SourceRecord, decode
from gpuquota.wire import events as ev
from tests.builders import Harness, job


def event(job_id: str) -> ev.JobSucceeded:
    return ev.JobSucceeded(event_id=f"e-{job_id}", occurred_at=1, job_id=job_id, attempt_id=f"{job_id}-a1")


def test_the_memo_gives_pydantics_json_for_each_object() -> None:
    first, second = event("a"), event("b")
    assert encode_events([first, second]) == f"[{first.model_dump_json()},{second.model_dump_json()}]"
    assert encode(first) == first.model_dump_json().encode()
    assert memo.message_json(second) is memo.message_json(second), "encoded once"
    twin = event("a")  # equal, but another object: encoded on its own
    assert memo.message_json(twin) == memo.message_json(first)


def test_the_memo_is_bounded() -> None:
    for i in range(memo.RECENT + 10):
        memo.message_json(event(str(i)))
    assert len(memo._recent) == memo.RECENT


def test_the_memo_gives_pydantics_json_for_every_kind_of_message() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("u").share("NOPE"))
    messages = [*h.inputs, *h.events]
    assert {type(m) for m in messages} >= {ev.JobAccepted, ev.InputRejected}
    for message in messages:
        assert memo.message_json(message) == message.model_dump_json()


def test_an_input_read_from_a_record_is_logged_as_the_records_json() -> None:
    submit = Harness.worked_example().inputs[-1]
    spaced = json.dumps(json.loads(submit.model_dump_json()), indent=1)  # valid, not pydantic's text
    record = SourceRecord("inputs", 0, 7, b"pool", spaced.encode())
    decoded = decode(record, "default")
    assert not isinstance(decoded, str)
    pool, message = decoded
    assert (pool, message) == ("pool", submit)
    assert encode_input(message) == spaced, "not encoded again"
    assert decode_record(1, encode_input(message), "[]").input == submit, "reads back equal"
