"""Kafka records of the distributed scheduler's inputs: decoding, and the reasons a record is refused.

The key of an input record is its pool (keyless records belong to the default pool); the value must be
a ``SchedulerInput``. Anything else becomes a ``DeadLetter`` with one of the reasons below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from pydantic import ValidationError

from gpuquota.scheduler.loop import Publisher
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.inputs import INPUT_ADAPTER, SchedulerInput

POOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


@dataclass(frozen=True, slots=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class RecordPublisher(Publisher, Protocol):
    """The distributed mode's publisher: the loop's ``Publisher`` plus the dead-letter topic."""

    async def dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        """Produce ``letter`` to the dead-letter topic and wait until the broker has it."""
        ...


def decode(record: SourceRecord, default_pool: str) -> tuple[str, SchedulerInput] | str:
    """``(pool, input)``, or the reason the record is a dead letter."""
    if record.key is None:
        pool = default_pool
    else:
        try:
            pool = record.key.decode("utf-8")
        except UnicodeDecodeError:
            return "invalid key: not UTF-8 (the key must be the pool name)"
        if not POOL_NAME.match(pool):
            return f"invalid key {pool[:200]!r}: not a pool name"
    try:
        message = INPUT_ADAPTER.validate_json(record.value)
    except ValidationError as exc:
        return rejection_reason(exc)
    return pool, message


def rejection_reason(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if not errors:
        return f"invalid: {exc}"
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        return f"malformed JSON: {first['msg']}"
    if kind == "union_tag_invalid":
        tag = (first.get("ctx") or {}).get("tag", "?")
        return f"unknown message type {tag!r}"
    if kind == "union_tag_not_found":
        return "no message type: the 'type' field is missing"
    details = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:10])
    return f"schema violation: {details}"


def pool_of(key: bytes | None, default_pool: str) -> str | None:
    """The pool a record's key names, or None if it names none."""
    if key is None:
        return default_pool
    pool = key.decode("utf-8", errors="replace")
    return pool if POOL_NAME.match(pool) else None
