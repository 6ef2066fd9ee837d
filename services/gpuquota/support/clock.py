"""The wall clock services stamp their own inputs with (epoch milliseconds); tests inject their own."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
