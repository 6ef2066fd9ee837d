"""Synthetic traces: ``gpuquota trace generate``.

Arrivals are a Poisson process whose rate follows a daily cycle (busiest at 15:00, quietest at 03:00;
``cycle`` is the swing: 0.6 means the rate goes from 40 % to 160 % of the mean), drawn by thinning.
Durations are log-normal (heavy right tail: the median and the spread ``sigma`` are given), capped at
``max_duration``. Shares, priorities and gang sizes are drawn from weighted choices. Seeded: the same
arguments always give the same trace.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuquota.sim.trace import TraceJob
from gpuquota.wire.fast_construct import fast_construct

DAY = 86_400.0
PEAK_HOUR = 15


def weighted(text: str, kind: type[str] | type[int] = str) -> tuple[list[object], list[float]]:
    """``"QS1:3,QS2:1"`` -> (["QS1", "QS2"], [3.0, 1.0]); a name without a weight weighs 1."""
    names: list[object] = []
    weights: list[float] = []
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, weight = part.strip().partition(":")
        names.append(kind(name))
        weights.append(float(weight) if weight else 1.0)
    if not names or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"expected NAME[:WEIGHT],... with positive weights, got {text!r}")
    return names, weights


@dataclass(frozen=True)
class Workload:
    shares: str = "QS1:2,QS2:1,QS3:1"
    unit: str = "ml.g5.xlarge"
    jobs: int = 1_000
    rate_per_hour: float = 60.0
    cycle: float = 0.6
    median_duration: float = 1_800.0
    sigma: float = 1.0
    max_duration: float = 7 * DAY
    priorities: str = "0:1"
    gang_sizes: str = "1:1"
    checkpoint_every: float | None = None
    preemption_retries: int | None = None
    failure_rate: float = 0.0
    seed: int = 1


def generate(w: Workload) -> Iterator[TraceJob]:
    rng = random.Random(w.seed)
    pick_share = _chooser(rng, *weighted(w.shares))
    pick_priority = _chooser(rng, *weighted(w.priorities, int))
    pick_size = _chooser(rng, *weighted(w.gang_sizes, int))
    peak_rate = w.rate_per_hour / 3600 * (1 + w.cycle)
    mu = math.log(w.median_duration)
    now = 0.0
    for _ in range(w.jobs):
        now = _next_arrival(rng, now, peak_rate, w)
        duration = min(w.max_duration, rng.lognormvariate(mu, w.sigma))
        fields = {
            "submitted_at": round(now, 3),
            "share": pick_share(),
            "priority": int(pick_priority()),
            "unit": w.unit,
            "instances": int(pick_size()),
            "duration": round(duration, 3),
            "exit_code": 1 if rng.random() < w.failure_rate else 0,
            "job_name": None,
            "checkpoint_every": None if w.checkpoint_every is None else float(w.checkpoint_every),
            "preemption_retries": w.preemption_retries,
        }
        # Values drawn here are valid by construction: skip pydantic's checks (a million jobs).
        yield fast_construct(TraceJob, fields)


def _chooser(rng: random.Random, names: list[object], weights: list[float]) -> Callable[[], str]:
    """``rng.choices(names, weights)[0]`` (the same draws), without recomputing the sums each time."""
    cumulative = list(itertools.accumulate(weights))
    total = cumulative[-1]
    labels = [str(name) for name in names]
    last = len(labels) - 1

    def choose() -> str:
        return labels[bisect.bisect(cumulative, rng.random() * total, 0, last)]

    return choose


def _next_arrival(rng: random.Random, now: float, peak_rate: float, w: Workload) -> float:
    """Thinning: candidates at the peak rate, each kept with probability rate(t) / peak rate."""
    while True:
        now += rng.expovariate(peak_rate)
        phase = 2 * math.pi * (now / DAY - PEAK_HOUR / 24)
        if rng.random() * (1 + w.cycle) <= 1 + w.cycle * math.cos(phase):
            return now
