"""Dead letters: records a consumer could not process, parked on ``gpuquota.dead-letter``.

A consumer that cannot decode a record (bad JSON, unknown type, failed validation) must not block its
partition; it produces a ``DeadLetter`` keyed by the original record's key and moves on. The original
value is kept as text when it is UTF-8, else as base64, so a person can read and replay it.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from pydantic import Field

from gpuquota.wire.base import EpochMs, Message


class DeadLetter(Message):
    type: Literal["DeadLetter"] = "DeadLetter"
    original: str
    """The original record's value, encoded as ``encoding`` says."""
    encoding: Literal["utf-8", "base64"]
    reason: Annotated[str, Field(max_length=4096)]
    topic: str
    partition: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]

    @classmethod
    def of(
        cls, value: bytes, *, reason: str, topic: str, partition: int, offset: int, occurred_at: EpochMs
    ) -> DeadLetter:
        """The dead letter for one record; its id derives from the record's position (redelivery-safe)."""
        encoding: Literal["utf-8", "base64"] = "utf-8"
        try:
            original = value.decode("utf-8")
        except UnicodeDecodeError:
            original, encoding = base64.b64encode(value).decode("ascii"), "base64"
        return cls(
            event_id=f"dead-letter/{topic}/{partition}/{offset}",
            occurred_at=occurred_at,
            original=original,
            encoding=encoding,
            reason=reason[:4096],
            topic=topic,
            partition=partition,
            offset=offset,
        )

    def value(self) -> bytes:
        """The original record's value, as bytes."""
        if self.encoding == "base64":
            return base64.b64decode(self.original)
        return self.original.encode("utf-8")
