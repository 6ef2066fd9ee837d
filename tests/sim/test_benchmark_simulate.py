"""`python -m benchmarks.simulate --jobs N --json` prints the keys the issue names."""

from __future__ import annotations

import json
import subprocess
import sys

KEYS = {"jobs", "events", "wall_seconds", "simulated_days", "jobs_per_s", "peak_rss_mb"}


def test_prints_one_json_object_with_the_figures() -> None:
    command = [sys.executable, "-m", "benchmarks.simulate", "--jobs", "500", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=180)
    figures = json.loads(result.stdout)
    assert figures.keys() >= KEYS
    assert figures["jobs"] == 500 and figures["finished"] == 500
    assert figures["events"] > 1000 and figures["jobs_per_s"] > 0 and figures["simulated_days"] > 0
