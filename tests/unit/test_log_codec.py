"""The log's entries and the published records: pydantic's JSON of each message, read back equal."""

from __future__ import annotations

from gpuquota.adapters.kafka import encode
from gpuquota.adapters.log_codec import decode_record, encode_events, encode_input
from gpuquota.wire import events as ev
from tests.builders import Harness, job


def test_every_kind_of_message_is_encoded_as_pydantic_encodes_it_and_reads_back_equal() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("u").share("NOPE"))
    assert {type(e) for e in h.events} >= {ev.JobAccepted, ev.InputRejected}
    for message in [*h.inputs, *h.events]:
        assert encode(message) == message.model_dump_json().encode()
    assert encode_events(h.events) == "[" + ",".join(e.model_dump_json() for e in h.events) + "]"
    for message in h.inputs:
        record = decode_record(7, encode_input(message), encode_events(h.events))
        assert (record.seq, record.input, record.events) == (7, message, tuple(h.events))
