"""JSON encoding of the log's entries, shared by the SQLite and PostgreSQL event stores.

An input is stored as its wire JSON; its events as one JSON array. Decoding goes through the wire
contract's discriminated unions, so a stored entry reads back equal to what was appended.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import TypeAdapter

from gpuquota.adapters.event_store import Record
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import INPUT_ADAPTER, SchedulerInput

EVENTS_ADAPTER: TypeAdapter[tuple[SchedulerEvent, ...]] = TypeAdapter(tuple[SchedulerEvent, ...])


def encode_input(message: SchedulerInput) -> str:
    return message.model_dump_json()


def encode_events(events: Sequence[SchedulerEvent]) -> str:
    return "[" + ",".join(event.model_dump_json() for event in events) + "]"


def decode_record(seq: int, input_json: str | bytes, events_json: str | bytes) -> Record:
    return Record(
        seq=seq,
        input=INPUT_ADAPTER.validate_json(input_json),
        events=EVENTS_ADAPTER.validate_json(events_json),
    )
