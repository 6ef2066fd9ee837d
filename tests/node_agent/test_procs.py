"""``procs.group_alive``: its shortcuts (no process in the group; the leader runs) agree with the scan."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

from gpuquota.node_agent import procs


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_group_is_alive_while_its_leader_or_any_member_runs() -> None:
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    try:
        assert procs.group_alive(leader.pid)  # the leader runs
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        assert procs.group_alive(leader.pid), "the leader is gone, its child still runs in the group"
        assert procs.group_members(leader.pid) == [member]
        os.killpg(leader.pid, signal.SIGKILL)
        wait_for(lambda: not procs.group_alive(leader.pid), "the group to end")
    finally:
        with_suppressed_kill(leader.pid)
        leader.stdout.close()


def test_a_zombie_leader_alone_is_not_alive() -> None:
    leader = subprocess.Popen(["sh", "-c", "exit 0"], start_new_session=True)
    try:
        wait_for(lambda: (procs._stat_fields(leader.pid) or ["Z"])[0] == "Z", "the leader to be a zombie")
        assert not procs.group_alive(leader.pid)
    finally:
        leader.wait()
    assert not procs.group_alive(leader.pid)


def with_suppressed_kill(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
