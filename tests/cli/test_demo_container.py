"""``gpuquota demo --runtime container``: the worked example with real containers (podman)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.containers import find_engine

pytestmark = pytest.mark.slow


def test_demo_runs_the_worked_example_in_containers(tmp_path: Path) -> None:
    engine = find_engine()
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("GPUQUOTA_ENDPOINT", None)
    argv = ["demo", "--runtime", "container", "--output-dir", str(tmp_path / "out"), "--step-timeout", "90"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpuquota", *argv], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "container runtime" in proc.stdout and "3/3 steps passed" in proc.stdout
    assert (tmp_path / "out" / "timeline.svg").exists()
    names = subprocess.run(
        engine.argv("ps", "--all", "--format", "{{.Names}}", "--filter", "label=gpuquota.job_id"),
        capture_output=True,
        text=True,
    ).stdout.split()
    left = []
    for name in names:
        inspected = subprocess.run(engine.argv("inspect", name), capture_output=True, text=True).stdout
        labels = (json.loads(inspected or "[{}]")[0].get("Config") or {}).get("Labels") or {}
        if str(labels.get("gpuquota.log", "")).startswith(str(temp)):
            left.append(name)
    assert left == [], "the demo's containers are gone when it ends"
