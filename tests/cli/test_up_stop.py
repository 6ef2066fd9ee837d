"""Stopping ``gpuquota up`` (Ctrl-C, SIGTERM): its running jobs are stopped, or with
``--leave-running`` left running for the next start to adopt (issue #28).

Real processes throughout: ``gpuquota up`` in its own process with a ``process`` node agent, a job
that sleeps for ten minutes and writes its pid, and ``os.kill(pid, 0)`` to see whether it still runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.ctl.api import poll
from tests.cli.conftest import Cli
from tests.gateway.conftest import batch_client

ROOT = Path(__file__).resolve().parents[2]
WORKED_EXAMPLE = ROOT / "deploy" / "examples" / "worked-example.yaml"
QUEUE = "my-sm-training-qm-jq"
LONG = "import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
TIMEOUT = 60.0


class Up:
    """``gpuquota up`` on ``data_dir`` in its own process (a fresh one per ``start``)."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir, self.log = data_dir, log
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, *flags: str) -> Any:
        env = {k: v for k, v in os.environ.items() if k not in ("GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL")}
        argv = ["up", "--port", "0", "--data-dir", str(self.data_dir), "--nodes", "ml.g5.xlarge=3", *flags]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuquota", *argv],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line.startswith("gpuquota ready on "), line + self.log.read_text()[-2000:]
        self.url = line.rsplit(" ", 1)[1]
        return batch_client(self.url)

    def stop(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(TIMEOUT)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.proc = None
        return code


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    made = Up(tmp_path / "data", tmp_path / "up.log")
    try:
        yield made
    finally:
        if made.proc is not None:
            made.proc.kill()
            made.proc.wait(30)
        pid = tmp_path / "work" / "pid"
        if pid.exists() and _alive(int(pid.read_text())):
            os.kill(int(pid.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; the job's process is reaped by its exit wrapper
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _submit_long(cli: Cli, work: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """The long job, submitted from ``work``; (job id, pid of its process) once it runs."""
    assert cli("apply", "-f", str(WORKED_EXAMPLE)).rc == 0
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    submitted = cli(
        "jobs",
        "submit",
        "--queue",
        QUEUE,
        "--share",
        "QS1",
        "--unit",
        "ml.g5.xlarge",
        "--",
        "python3",
        "-c",
        LONG,
    )
    assert submitted.rc == 0, submitted.err
    pid = poll(lambda: int(t) if (t := _read(work / "pid")) else None, time.monotonic() + TIMEOUT)
    assert pid is not None, "the job never started"
    return submitted.out.strip(), pid


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _job(batch: Any, job_id: str) -> dict[str, Any]:
    return dict(batch.describe_service_job(jobId=job_id))


def test_stopping_gpuquota_up_stops_its_running_jobs(
    up: Up, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = up.start()
    job_id, pid = _submit_long(Cli(capsys, up.url), tmp_path / "work", monkeypatch)
    assert up.stop(signal.SIGINT) == 0  # Ctrl-C
    assert not _alive(pid), "gpuquota up left its job's process running"
    (tmp_path / "work" / "pid").unlink()
    # the next start runs the job again: a new attempt, the first one STOPPED by the stop
    batch = up.start()
    again = poll(
        lambda: int(t) if (t := _read(tmp_path / "work" / "pid")) else None, time.monotonic() + TIMEOUT
    )
    assert again is not None and again != pid
    job = _job(batch, job_id)
    # 2 or 3 attempts: one dispatched while the stack stopped is dropped, and requeued at the start
    assert job["status"] == "RUNNING" and len(job["attempts"]) >= 2
    assert "handed back by node local-1" in job["attempts"][0]["statusReason"]
    assert up.stop(signal.SIGTERM) == 0
    assert not _alive(again)


def test_leave_running_leaves_them_for_the_next_start_to_adopt(
    up: Up, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    up.start("--leave-running")
    job_id, pid = _submit_long(Cli(capsys, up.url), tmp_path / "work", monkeypatch)
    assert up.stop(signal.SIGTERM) == 0
    assert _alive(pid), "--leave-running stopped the job"
    batch = up.start()  # adopts it: the same attempt goes on
    job = _job(batch, job_id)
    assert job["status"] == "RUNNING" and len(job["attempts"]) == 1
    assert "adopted (pid" in (tmp_path / "up.log").read_text()
    assert up.stop(signal.SIGTERM) == 0  # without the flag: stopped now
    assert not _alive(pid)
