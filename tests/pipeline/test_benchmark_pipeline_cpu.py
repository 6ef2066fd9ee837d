"""`python -m benchmarks.pipeline_cpu --json` decides every job it submits and reports its CPU per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_prints_the_cpu_per_job_of_the_jobs_it_decided(database_url: str) -> None:
    command = [sys.executable, "-m", "benchmarks.pipeline_cpu", "--jobs", "120", "--batch", "40", "--json"]
    env = {**os.environ, "DATABASE_URL": database_url}
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, env=env)
    figures = json.loads(result.stdout)
    assert (figures["jobs"], figures["batch"]) == (120, 40)
    assert figures["decided"] > 2 * 120, "each job's submission and report, and the setup"
    assert figures["cpu_ms_per_job"] > 0
