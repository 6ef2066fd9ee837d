"""``children.run``, the container engine's calls, on the services' event loop (uvloop, through
``run_loop``) and on asyncio's: a command's end is its exit, even when something it started keeps its
output open, and it hands no descriptor of ours to what it starts."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.node_agent import children, procs
from gpuquota.observe import startup

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


def _asyncio_loop(main: Coroutine[Any, Any, Any]) -> Any:
    import asyncio

    return asyncio.run(main)


@pytest.fixture(params=["services' loop", "asyncio's loop"])
def run_loop(request: pytest.FixtureRequest) -> Runner:
    if request.param == "services' loop":
        if sys.platform == "linux":
            pytest.importorskip("uvloop", reason="uvloop is a dependency on Linux")  # what run_loop uses
        return startup.run_loop
    return _asyncio_loop


@pytest.fixture
def background() -> Iterator[list[int]]:
    """Pids of what the commands left running; killed afterwards."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if procs.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_command_ends_at_its_exit_while_its_own_child_keeps_its_output_open(
    run_loop: Runner, background: list[int]
) -> None:
    # as `podman run --detach` leaves conmon running with whatever it inherited
    started = time.monotonic()
    code, out, err = run_loop(children.run(["sh", "-c", "sleep 60 & echo $!; echo done >&2"], 30))
    took = time.monotonic() - started
    background.append(int(out.split()[0]))
    assert (code, err) == (0, "done\n")
    assert procs.pid_alive(background[0]), "the background child still runs, holding stdout and stderr"
    assert took < 10, f"returned after {took:.1f} s: it waited for the output's end, not for the exit"


def test_a_command_gets_no_descriptor_but_its_stdin_stdout_and_stderr(run_loop: Runner) -> None:
    read, write = os.pipe()
    os.set_inheritable(write, True)  # as one the agent's parent left open would be
    try:
        code, out, _ = run_loop(children.run(["ls", "/proc/self/fd"], 30))
    finally:
        os.close(read)
        os.close(write)
    assert code == 0
    assert sorted(map(int, out.split())) == [0, 1, 2, 3], f"3 is the directory ls reads; got {out.split()}"


def test_a_command_past_its_timeout_is_killed(
    run_loop: Runner, background: list[int], tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"

    async def go() -> None:
        with pytest.raises(TimeoutError):
            await children.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], 0.5)

    run_loop(go())
    background.append(int(pid_file.read_text()))
    assert not procs.pid_alive(background[0]), "the command was killed and reaped"
