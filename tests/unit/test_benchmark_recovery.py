"""`python -m benchmarks.recovery --json`: each reader recovers the whole log in its own process and
reports its peak RSS; the busy pool's log leaves few jobs in the state, every job in the read model."""

from __future__ import annotations

import json
import subprocess
import sys


def test_each_reader_reports_its_peak_and_what_it_recovered() -> None:
    command = [sys.executable, "-m", "benchmarks.recovery", "--events", "3000", "--json"]
    figures = json.loads(
        subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    )
    assert figures["store"] == "sqlite" and figures["events"] >= 3000 and not figures["queued"]
    scheduler, read_model = figures["scheduler"], figures["read_model"]
    for reader in (scheduler, read_model):
        assert reader["peak_rss_mb"] >= reader["base_rss_mb"] > 0
        assert reader["events_per_s"] > 0 and reader["seconds"] > 0
    assert scheduler["state_jobs"] == read_model["state_jobs"] <= 256  # at most one per slot
    assert read_model["read_model_jobs"] > 900  # about one job per three events
