"""What an overload costs the pipeline: ``python -m benchmarks.pipeline --overload F [--rate auto]``.

The question (issue #30) is whether a pipeline offered ``F`` times the rate it sustains still decides
at least 95 % of its peak. That needs the sustainable rate of *this* machine *now* (its speed moves by
2x with the other work on it), so with ``--rate auto`` the benchmark finds it first: runs at rising
offered rates (``FIRST_RATE``, then ``STEP`` times the last) until one does not keep up (falling
rates if the first does not), that is admits or decides less than ``KEPT_UP`` of what it was offered
or has a submit-to-scheduled p99 over ``KEPT_UP_P99_MS`` (a backlog that grows instead of a pipeline
that keeps pace). The sustainable rate is the highest offered rate that kept up; then it runs at ``F``
times that. With a number, ``--rate``
is taken as the sustainable rate and the search is one run at it.

Every run is ``benchmarks.pipeline.throughput`` on fresh servers with the same admission bounds
(``--max-backlog``, ``--max-backlog-seconds``; none: the backlog absorbs everything). Printed:
``sustainable_per_s``; ``offered_per_s`` and ``decided_per_s`` of each run, the search's first;
``peak_per_s``, the highest decided of them all; ``at_overload_per_s``, the last run's decided;
``ratio``, that over the peak (the target: at least 0.95); ``refused`` and ``lost_jobs`` of each run;
``calibration_ms`` (before and after) of each run: the machine's speed while it ran; and each run's
whole result (``runs``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from gpuquota.gateway.admission import Admission

FIRST_RATE = 400.0
"""Where ``--rate auto`` starts (jobs/s): kept up on this 2-vCPU host even when it is loaded."""
STEP = 1.5
"""Each search run offers this many times the last one's rate."""
KEPT_UP = 0.95
"""A run keeps up when it decides at least this share of what it was offered..."""
KEPT_UP_P99_MS = 2000.0
"""... and its jobs wait at most this long from submission to dispatch (p99)."""
MAX_SEARCH_RUNS = 5

Run = Callable[..., Awaitable[dict[str, Any]]]


async def measured(throughput: Run, rate: float, bounds: Admission | None, **run: Any) -> dict[str, Any]:
    """One run, its headline on stderr as it ends (a search takes minutes)."""
    result = await throughput(rate, admission=fresh(bounds), **run)
    shown = ("rate", "jobs_per_s", "submit_to_scheduled_p99_ms", "refused", "calibration_ms")
    print(json.dumps({key: result.get(key) for key in shown}), file=sys.stderr)
    return result


def kept_up(result: dict[str, Any]) -> bool:
    """Whether a run took and decided what it was offered, in time."""
    offered: float = result["rate"]
    took: bool = result["submitted"] >= KEPT_UP * offered * result["seconds"]
    decided: bool = result["jobs_per_s"] >= KEPT_UP * offered
    return took and decided and result["submit_to_scheduled_p99_ms"] <= KEPT_UP_P99_MS


async def search(
    throughput: Run, rate: float | None, bounds: Admission | None, **run: Any
) -> list[dict[str, Any]]:
    """The runs that find the sustainable rate: up by ``STEP`` while they keep up, down while they
    do not, until the direction turns (at most ``MAX_SEARCH_RUNS``); one run at ``rate`` if given."""
    results = [await measured(throughput, rate or FIRST_RATE, bounds, **run)]
    rising = kept_up(results[0])
    while rate is None and len(results) < MAX_SEARCH_RUNS and kept_up(results[-1]) == rising:
        offered = results[-1]["rate"] * (STEP if rising else 1 / STEP)
        results.append(await measured(throughput, round(offered), bounds, **run))
    return results


def sustainable_rate(runs: list[dict[str, Any]]) -> float:
    """The highest offered rate that kept up (the lowest tried when none did)."""
    kept = [result["rate"] for result in runs if kept_up(result)]
    return max(kept, default=min(result["rate"] for result in runs))


async def overload(
    throughput: Run, factor: float, rate: float | None, bounds: Admission | None, **run: Any
) -> dict[str, Any]:
    """The search, then a run at ``factor`` times the sustainable rate (module docstring)."""
    runs = await search(throughput, rate, bounds, **run)
    base = sustainable_rate(runs)
    runs.append(await measured(throughput, base * factor, bounds, **run))
    decided = [result["jobs_per_s"] for result in runs]
    peak = max(decided)
    return {
        "sustainable_per_s": base,
        "offered_per_s": [result["rate"] for result in runs],
        "decided_per_s": decided,
        "peak_per_s": peak,
        "at_overload_per_s": decided[-1],
        "ratio": round(decided[-1] / max(peak, 1e-9), 3),
        "refused": [result["refused"] for result in runs],
        "lost_jobs": [result["lost_jobs"] for result in runs],
        "calibration_ms": [result["calibration_ms"] for result in runs],
        "runs": runs,
    }


def fresh(bounds: Admission | None) -> Admission | None:
    """A new admission control with ``bounds`` (each run counts its own backlog and refusals)."""
    return None if bounds is None else Admission(bounds.max_backlog, bounds.max_seconds)
