"""Fresh ids: job ids and request ids (UUID version 4), input ids (UUID version 7).

Every process that makes inputs takes its ids here: the gateway (a submission takes three), the
scheduler's shell, the node agent's reports and ``gpuquota.client.events``. Each id used to cost a
``getrandom`` system call of its own (``os.urandom(16)``, about 6 % of the gateway's event loop at
2,400 submits/s, py-spy); the random bits now come from a block drawn once per ``_IDS_PER_DRAW`` ids,
from the same source. A forked child starts with a block of its own.

An input id only has to be unique, and it is the key of the event log's ``UNIQUE (input_id)`` index:
random keys put every input's index entry on a random page of that index, which each commit then
rewrites whole (about one 4 KiB page per input). Version 7 (RFC 9562: the millisecond in the first 48
bits, then 74 random bits) keeps the entries of a batch, and of consecutive batches, on the index's
last page. Job ids stay version 4: clients see them, and they must not tell when a job was submitted.
"""

from __future__ import annotations

import os
import threading
import time

_IDS_PER_DRAW = 256
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


class _RandomHex:
    """Random hexadecimal digits, 32 at a time, from ``os.urandom`` blocks (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._block = ""
        self._at = 0

    def take(self) -> str:
        with self._lock:
            if self._at >= len(self._block):
                self._block = os.urandom(16 * _IDS_PER_DRAW).hex()
                self._at = 0
            at = self._at
            self._at = at + 32
        return self._block[at : at + 32]

    def forget(self) -> None:
        """After a fork: the parent's remaining digits are the parent's."""
        self._lock = threading.Lock()
        self._reset()


_random = _RandomHex()
os.register_at_fork(after_in_child=_random.forget)


def uuid4() -> str:
    """``str(uuid.uuid4())``: 122 random bits, version 4, RFC variant."""
    h = _random.take()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def uuid7(now_ms: int | None = None) -> str:
    """A UUID version 7: ``now_ms`` (default: the clock) in the first 48 bits, 74 random bits."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    t = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
    h = _random.take()
    return f"{t[:8]}-{t[8:]}-7{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"
