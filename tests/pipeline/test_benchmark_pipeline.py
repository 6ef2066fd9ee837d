"""`python -m benchmarks.pipeline --json`: a short run dispatches every job it submits, and its scheduler
decides every input (the node player's reports included) before the run ends; the warm-up's jobs are not
counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_short_run_dispatches_every_job_and_leaves_no_input_undecided(
    kafka_bootstrap: str, database_url: str
) -> None:
    command = [sys.executable, "-m", "benchmarks.pipeline", "--rate", "100", "--seconds", "1"]
    command += ["--warmup", "1", "--json"]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DATABASE_URL": database_url}
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, env=env)
    figures = json.loads(result.stdout)
    assert figures["submitted"] == figures["scheduled"] == 100
    assert (figures["lost_jobs"], figures["undecided_inputs"], figures["duplicate_dispatches"]) == (0, 0, 0)
    assert figures["warmup_seconds"] == 1
    assert figures["cpu_ms_per_job"]["scheduler"] > 0 and figures["cpu_ms_per_job"]["client"] > 0


def test_overload_runs_at_1x_and_2x_and_prints_the_refused(kafka_bootstrap: str, database_url: str) -> None:
    command = [sys.executable, "-m", "benchmarks.pipeline", "--rate", "100", "--seconds", "1"]
    command += ["--warmup", "0", "--overload", "2", "--max-backlog", "1", "--json"]
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DATABASE_URL": database_url}
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, env=env)
    figures = json.loads(result.stdout)
    assert figures["offered_per_s"] == [100, 200]
    assert figures["peak_per_s"] == max(figures["decided_per_s"]) > 0
    assert figures["ratio"] == round(figures["decided_per_s"][1] / figures["peak_per_s"], 3)
    assert figures["refused"][1] > 0  # one undecided submission at most: the second of a batch waits
    assert figures["lost_jobs"] == [0, 0]
    assert [run["refused"] for run in figures["runs"]] == figures["refused"]
