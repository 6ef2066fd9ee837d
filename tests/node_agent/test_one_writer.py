"""One node agent per work directory, and only absolute directories for jobs (issue #11)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuquota.node_agent import SimulatedRuntime, parse_slots
from gpuquota.node_agent.prepare import prepare
from gpuquota.support.dirlock import DirectoryInUse, DirectoryLock
from tests.node_agent.conftest import NODE, AgentFactory, Scheduler, python_payload, run_cmd, wait_until


async def test_a_second_agent_on_the_same_work_dir_refuses_to_start(make_agent: AgentFactory) -> None:
    first = make_agent(Scheduler(), runtime=SimulatedRuntime())
    await first.start()
    await first.deliver(
        run_cmd(python_payload("pass", Environment={"GPUQUOTA_SIM_DURATION_SECONDS": "3600"}))
    )
    await wait_until(lambda: "job-1-a1" in first.state_path.read_text(), what="the attempt's record")
    second = make_agent(Scheduler(), work_dir=first.work_dir)
    with pytest.raises(DirectoryInUse, match=f"data dir {first.work_dir} is in use by pid {os.getpid()}"):
        await second.start()
    records = first.state_path.read_text()
    await second.stop()  # as a service stops after a failed start: it leaves the first one's records alone
    assert first.state_path.read_text() == records
    await first.stop()
    await second.start()  # the first one is gone: its lock went with it
    await second.stop()


def test_the_lock_is_released_by_its_holder_only(tmp_path: Path) -> None:
    lock = DirectoryLock(tmp_path / "d")
    lock.acquire()
    other = DirectoryLock(tmp_path / "d")
    with pytest.raises(DirectoryInUse):
        other.acquire()
    other.release()  # never held: nothing happens
    with pytest.raises(DirectoryInUse):
        other.acquire()
    lock.release()
    other.acquire()
    other.release()


def test_every_directory_a_job_sees_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = prepare(run_cmd(python_payload("pass")), NODE, parse_slots("ml.g5.xlarge=1"), Path(".gpuquota/n"))
    paths = [Path(spec.env["SM_CHECKPOINT_DIR"]), spec.cwd, spec.log_path, spec.exit_path]
    assert all(p is not None and p.is_absolute() for p in paths), paths
    assert Path(spec.env["SM_CHECKPOINT_DIR"]) == tmp_path / ".gpuquota/n/checkpoints/job-1"
