"""``benchmarks.pipeline_overload``: the search for the sustainable rate and the ratio at overload, over
a pipeline played by a function (above its capacity the p99 grows and it decides ``collapse`` times
its capacity)."""

from __future__ import annotations

from typing import Any

from benchmarks.pipeline_overload import FIRST_RATE, STEP, overload
from gpuquota.gateway.admission import Admission

CAPACITY = 1000.0
SECONDS = 10.0


def pipeline(collapse: float, capacity: float = CAPACITY) -> Any:
    """A pipeline that decides ``capacity`` jobs/s at most, and ``collapse`` times that when offered
    more (1.0: refuses the excess and holds its rate)."""
    offered_rates: list[float] = []

    async def throughput(rate: float, admission: Admission | None = None, **_: Any) -> dict[str, Any]:
        offered_rates.append(rate)
        over = rate > capacity
        decided = capacity * collapse if over else rate
        return {
            "rate": rate,
            "seconds": SECONDS,
            "submitted": int(decided * SECONDS),
            "jobs_per_s": decided,
            "submit_to_scheduled_p99_ms": 5000.0 if over else 200.0,
            "refused": int((rate - decided) * SECONDS),
            "lost_jobs": 0,
            "calibration_ms": [100.0, 100.0],
        }

    throughput.offered = offered_rates  # type: ignore[attr-defined]
    return throughput


async def test_auto_rises_until_a_run_falls_behind_then_offers_twice_the_last_that_kept_up() -> None:
    run = pipeline(collapse=1.0)
    result = await overload(run, 2.0, None, Admission(100, 1.0))
    assert (FIRST_RATE, STEP) == (400.0, 1.5)
    assert run.offered == [400.0, 600, 900, 1350, 1800]  # 1350 > CAPACITY: behind
    assert result["sustainable_per_s"] == 900
    assert (result["peak_per_s"], result["at_overload_per_s"], result["ratio"]) == (1000.0, 1000.0, 1.0)


async def test_a_given_rate_is_taken_as_the_sustainable_one_and_a_collapse_shows_in_the_ratio() -> None:
    result = await overload(pipeline(collapse=0.6), 2.0, 800.0, None)
    assert result["offered_per_s"] == [800.0, 1600.0]
    assert (result["peak_per_s"], result["at_overload_per_s"], result["ratio"]) == (800.0, 600.0, 0.75)


async def test_auto_steps_down_when_the_first_rate_is_already_too_much() -> None:
    run = pipeline(collapse=0.6, capacity=300.0)
    result = await overload(run, 2.0, None, None)
    assert run.offered == [400.0, 267, 534]  # 400 > 300: behind; 267 kept up
    assert result["sustainable_per_s"] == 267
    assert (result["at_overload_per_s"], result["ratio"]) == (180.0, 0.674)
