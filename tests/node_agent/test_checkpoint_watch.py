"""S12: the agent's view of each running attempt's last checkpoint, as its heartbeats report it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpuquota.node_agent.checkpoint_watch import newest_mtime_ms, refresh
from gpuquota.node_agent.prepare import checkpoint_dir
from gpuquota.node_agent.records import Attempt, AttemptPhase
from tests.node_agent.conftest import python_payload, run_cmd


def touch(path: Path, mtime_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (mtime_s, mtime_s))


def test_the_newest_file_anywhere_below_counts_but_partial_downloads_do_not(tmp_path: Path) -> None:
    assert newest_mtime_ms(tmp_path / "missing") is None
    assert newest_mtime_ms(tmp_path) is None
    touch(tmp_path / "a", 1_000)
    touch(tmp_path / "deep" / "er" / "b", 2_000)
    touch(tmp_path / "c.gpuquota-part", 3_000)
    assert newest_mtime_ms(tmp_path) == 2_000_000


def test_running_attempts_get_their_checkpoint_and_uploads_win(tmp_path: Path) -> None:
    running = Attempt(run_cmd(python_payload("pass"), job_id="job-1"), phase=AttemptPhase.RUNNING)
    uploaded = Attempt(run_cmd(python_payload("pass"), job_id="job-2"), phase=AttemptPhase.RUNNING)
    launching = Attempt(run_cmd(python_payload("pass"), job_id="job-3"))
    for att, when in ((running, 5_000), (uploaded, 6_000), (launching, 7_000)):
        local = checkpoint_dir(att.command, tmp_path)
        assert local is not None
        touch(local / "model.pt", when)
    asyncio.run(refresh([running, uploaded, launching], tmp_path, False, {"job-2-a1": 4_321}))
    assert running.checkpoint_at == 5_000_000
    assert uploaded.checkpoint_at == 4_321  # with S3, what another node could resume from
    assert launching.checkpoint_at is None  # not running: nothing to lose yet
    assert running.known().checkpoint_at == 5_000_000
