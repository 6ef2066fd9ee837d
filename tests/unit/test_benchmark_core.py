"""`python -m benchmarks.core --json` prints the keys the issue names, in both modes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KEYS = {
    "inputs_per_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "peak_rss_mb",
    "bytes_per_queued_job",
}


@pytest.mark.parametrize("mode", ["step", "decide"])
def test_prints_one_json_object_with_the_figures(mode: str) -> None:
    command = [sys.executable, "-m", "benchmarks.core", "--queued", "300", "--inputs", "400", "--json"]
    result = subprocess.run(
        [*command, "--mode", mode], capture_output=True, text=True, check=True, timeout=120
    )
    figures = json.loads(result.stdout)
    assert figures.keys() >= KEYS and figures["mode"] == mode and figures["inputs"] == 400
    assert figures["inputs_per_s"] > 0 and figures["latency_p99_ms"] >= figures["latency_p50_ms"]


def test_both_modes_decide_the_same() -> None:
    """Same seed, same workload: ``step`` and ``decide`` + ``evolve`` emit the same events."""
    from benchmarks import core

    step = core.run(300, 400, seed=5, progress=False, mode="step")
    decide = core.run(300, 400, seed=5, progress=False, mode="decide")
    assert step["events"] == decide["events"] and step["queued_at_end"] == decide["queued_at_end"]
