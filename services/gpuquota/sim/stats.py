"""Figures a replay aggregates as it goes, in memory that does not grow with the trace.

``WaitSketch`` is a fixed-size histogram of wait times (log-spaced buckets, 1 % wide: quantiles within
about 1 %, the maximum exact). ``UnitLedger`` integrates each share's usage of one capacity unit over
virtual time: used, in quota, borrowed and lent instance-milliseconds. ``Sampler`` keeps a bounded
series of per-share usage for the plot, halving its resolution whenever it grows too long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuquota.core.quota import attribute_lent

GROWTH = 1.01
LOG_GROWTH = math.log(GROWTH)
BUCKETS = 3_000
FLOOR = 0.001
"""Waits under a millisecond count as no wait; 1.01 ** 3000 ms is far beyond any wait (a backstop)."""
MAX_SAMPLES = 2_000
MS_PER_HOUR = 3_600_000


@dataclass
class WaitSketch:
    counts: list[int] = field(default_factory=lambda: [0] * (BUCKETS + 1))
    total: int = 0
    max_seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.total += 1
        self.max_seconds = max(self.max_seconds, seconds)
        self.counts[self._bucket(seconds)] += 1

    @staticmethod
    def _bucket(seconds: float) -> int:
        """Bucket 0 holds no wait; bucket k >= 1 holds [1.01**(k-1), 1.01**k) milliseconds."""
        if seconds < FLOOR:
            return 0
        return min(BUCKETS, 1 + int(math.log(seconds / FLOOR) / LOG_GROWTH))

    def quantile(self, fraction: float) -> float:
        """The wait below which ``fraction`` of the jobs waited (the bucket's upper edge, capped at max)."""
        if self.total == 0:
            return 0.0
        rank = max(1, math.ceil(fraction * self.total))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(_edge(index), self.max_seconds)
        return self.max_seconds

    def points(self) -> list[tuple[float, int]]:
        """(upper edge in seconds, count) of the non-empty buckets, for the plot."""
        return [(_edge(i), n) for i, n in enumerate(self.counts) if n]


def _edge(index: int) -> float:
    return 0.0 if index == 0 else FLOOR * GROWTH**index


@dataclass
class ShareCounters:
    submitted: int = 0
    rejected: int = 0
    finished: int = 0
    failed: int = 0
    failed_by_preemption: int = 0
    preemptions: int = 0
    lost_ms: int = 0
    """Instance-milliseconds of work thrown away by preemptions (after the last checkpoint)."""
    waits: WaitSketch = field(default_factory=WaitSketch)


class UnitLedger:
    """Usage integrals of every share of the configuration in one capacity unit.

    Each share's own integrals (used, in quota, borrowed) are brought up to date only when its usage
    changes (``last[i]``); lent instances depend on every share, so they are integrated on every
    change, but only while something is borrowed.
    """

    __slots__ = (
        "borrowed",
        "borrowed_ms",
        "capacity",
        "in_quota_ms",
        "last",
        "lends",
        "lent_last",
        "lent_ms",
        "limits",
        "used",
        "used_ms",
    )

    def __init__(self, capacity: int, limits: list[int], lends: list[bool], start: int) -> None:
        self.capacity = capacity
        self.limits = limits
        self.lends = lends
        n = len(limits)
        self.used = [0] * n
        self.used_ms = [0] * n
        self.in_quota_ms = [0] * n
        self.borrowed_ms = [0] * n
        self.lent_ms = [0] * n
        self.last = [start] * n
        self.lent_last = start
        self.borrowed = 0
        """Instances borrowed by all shares together, now."""

    def change(self, now: int, share: int, delta: int) -> None:
        if now != self.lent_last:
            self._settle_lent(now)
        if now != self.last[share]:
            self._settle(now, share)
        used, limit = self.used[share], self.limits[share]
        after = used + delta
        if used > limit or after > limit:  # the borrowed instances change only above the limit
            self.borrowed += (after - limit if after > limit else 0) - (used - limit if used > limit else 0)
        self.used[share] = after

    def advance(self, now: int) -> None:
        self._settle_lent(now)
        for share in range(len(self.used)):
            self._settle(now, share)

    def _settle(self, now: int, share: int) -> None:
        dt = now - self.last[share]
        self.last[share] = now
        used = self.used[share]
        if dt <= 0 or not used:
            return
        limit = self.limits[share]
        self.used_ms[share] += used * dt
        if used > limit:
            self.in_quota_ms[share] += limit * dt
            self.borrowed_ms[share] += (used - limit) * dt
        else:
            self.in_quota_ms[share] += used * dt

    def _settle_lent(self, now: int) -> None:
        dt = now - self.lent_last
        self.lent_last = now
        if dt > 0 and self.borrowed:
            for i, given in attribute_lent(self.capacity, self.limits, self.used, self.lends).items():
                self.lent_ms[i] += given * dt


@dataclass
class Sampler:
    """Per-share usage (instances, all units together) at regular virtual times, at most MAX_SAMPLES."""

    shares: int
    width_ms: int = 60_000
    times: list[int] = field(default_factory=list)
    values: list[tuple[int, ...]] = field(default_factory=list)
    next_at: int | None = None

    def observe(self, now: int, usage: list[int]) -> None:
        """Call before usage changes at ``now``: records the usage that held until ``now``."""
        if self.next_at is None:
            self.next_at = now
        while self.next_at <= now:
            self.times.append(self.next_at)
            self.values.append(tuple(usage))
            self.next_at += self.width_ms
            if len(self.times) > MAX_SAMPLES:
                self.times = self.times[::2]
                self.values = self.values[::2]
                self.width_ms *= 2
                self.next_at = self.times[-1] + self.width_ms
