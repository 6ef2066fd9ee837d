"""``gpuquota demo`` end to end: its own embedded stack with real processes, an existing stack given by
``--endpoint``, and a stack too small for the worked example (a step fails, exit code 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.ctl.timeline import Segment, segments_from_samples
from tests.cli.conftest import Cli
from tests.gateway.conftest import StackThread

SVG = "{http://www.w3.org/2000/svg}"


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def processes_under(directory: Path) -> list[int]:
    """Pids of processes whose working directory is inside ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(directory)):
            found.append(int(entry.name))
    return found


def test_demo_with_its_own_stack_and_real_processes(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    out_dir = tmp_path / "out"
    env = {**os.environ, "TMPDIR": str(temp)}
    env.pop("GPUQUOTA_ENDPOINT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "gpuquota", "demo", "--output-dir", str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "\x1b[" not in out  # no colours when stdout is not a TTY
    assert "process runtime" in out
    for step in (1, 2, 3):
        assert f"PASS  step {step}: reached in" in out
    assert "MISMATCH" not in out
    assert (
        "qs1_job_med   RUNNABLE, preempted 1x (cross-share)  RUNNABLE, preempted 1x (cross-share)  ok" in out
    )
    assert "PASS  3/3 steps passed" in out
    svg = out_dir / "timeline.svg"
    assert out.strip().endswith(f"Timeline: {svg}")
    texts = svg_texts(svg)
    for name in ("qs1_job_high", "qs1_job_med", "qs1_job_low", "qs2_job_1"):
        assert name in texts
    assert "cross-share preemption for qs2_job_1" in texts
    assert "in-share preemption for qs1_job_low" in texts
    assert "QS1 · priority 1 -> 4" in texts
    # The demo terminated its jobs and waited for them: no job process outlives it.
    assert processes_under(temp) == []
    assert list(temp.iterdir()) == []  # and its event log is gone


@pytest.fixture
def simulated() -> Iterator[StackThread]:
    stack = StackThread(nodes="ml.g5.xlarge=3", runtime="simulated", tick_seconds=0.5)
    try:
        yield stack
    finally:
        stack.close()


def test_demo_against_a_running_stack_twice(
    simulated: StackThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(capsys, simulated.stack.url)
    first = cli("demo", "--output-dir", str(tmp_path))
    assert first.rc == 0, first.out + first.err
    assert "PASS  3/3 steps passed" in first.out
    assert "6 created" in first.out
    # The second run finds the resources unchanged and the first run's jobs finished.
    second = cli("demo", "--output-dir", str(tmp_path))
    assert second.rc == 0, second.out + second.err
    assert "6 unchanged" in second.out and "left in" not in second.out
    assert "PASS  3/3 steps passed" in second.out
    jobs = simulated.client.list_service_jobs(jobQueue="my-sm-training-qm-jq", jobStatus="FAILED")
    assert len(jobs["jobSummaryList"]) == 8


def test_demo_fails_when_the_pool_is_too_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = StackThread(nodes="ml.g5.xlarge=2", runtime="simulated")
    try:
        result = Cli(capsys, small.stack.url)("demo", "--output-dir", str(tmp_path), "--step-timeout", "0.5")
        assert result.rc == 1
        assert "qs1_job_med   RUNNING   RUNNABLE  MISMATCH" in result.out
        assert "FAIL  step 1: not reached within 0.5 s" in result.out
        assert "Step 2" not in result.out
        assert "FAIL  0/3 steps passed" in result.out
        assert (tmp_path / "timeline.svg").exists()
        # its jobs were terminated all the same
        batch = small.client
        listed = batch.list_service_jobs(jobQueue="my-sm-training-qm-jq", jobStatus="FAILED")[
            "jobSummaryList"
        ]
        assert len(listed) == 3
    finally:
        small.close()


def test_demo_connection_refused(
    closed_port: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from gpuquota.entrypoints.cli import main

    assert main(["demo", "--endpoint", closed_port, "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"gpuquota demo: cannot reach gpuquota at {closed_port}: connection refused "
        "(is `gpuquota up` running? see --endpoint)\n"
    )


def test_segments_from_samples() -> None:
    samples = [
        (0, "SUBMITTED"),
        (5, "RUNNABLE"),
        (5, "SCHEDULED"),
        (8, "RUNNING"),
        (8, "RUNNING"),
        (20, "RUNNABLE"),
    ]
    assert segments_from_samples(samples, 30) == [
        Segment(0, 5, "SUBMITTED"),
        Segment(5, 8, "SCHEDULED"),
        Segment(8, 20, "RUNNING"),
        Segment(20, 30, "RUNNABLE"),
    ]
