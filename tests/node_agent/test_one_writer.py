"""One node agent per work directory (issue #11): a second one refuses to start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuquota.dirlock import DirectoryInUse, DirectoryLock
from tests.node_agent.conftest import AgentFactory, Scheduler


async def test_a_second_agent_on_the_same_work_dir_refuses_to_start(make_agent: AgentFactory) -> None:
    first = make_agent(Scheduler())
    await first.start()
    second = make_agent(Scheduler(), work_dir=first.work_dir)
    with pytest.raises(DirectoryInUse, match=f"data dir {first.work_dir} is in use by pid {os.getpid()}"):
        await second.start()
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
