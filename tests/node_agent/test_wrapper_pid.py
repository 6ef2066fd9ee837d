"""An agent that died between a launch and the record of its pid finds the exit wrapper by the pid
record the wrapper wrote first to its exit file (``runtime.wrapper_pid``), or by the ``EXIT_FILE.pid``
file wrappers before session 7 wrote; the outcome later replaces that record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from gpuquota.node_agent.launch import AdoptRecord
from gpuquota.node_agent.runtime import ProcessHandle, ProcessRuntime, wrapper_pid
from tests.node_agent.conftest import wait_until


def _unrecorded(exit_file: Path) -> AdoptRecord:
    """What ``state.json`` holds of an attempt launched just before the agent died: no pid yet."""
    return AdoptRecord(runtime="process", pid=None, pgid=None, start_time=None, exit_path=str(exit_file))


async def test_an_unrecorded_wrapper_is_adopted_by_its_pid_record(
    exit_wrapper: tuple[str, ...], tmp_path: Path
) -> None:
    exit_file = tmp_path / "exit.json"
    argv = [*exit_wrapper, str(exit_file), "sleep", "30"]
    with subprocess.Popen(argv, start_new_session=True) as wrapper:
        try:
            await wait_until(lambda: wrapper_pid(str(exit_file)), what="the wrapper's pid record")
            runtime = ProcessRuntime(poll_seconds=0.01, exit_wrapper=exit_wrapper)
            handle = runtime.adopt(_unrecorded(exit_file))
            assert isinstance(handle, ProcessHandle) and handle.pid == wrapper.pid
        finally:
            os.killpg(wrapper.pid, signal.SIGTERM)
        assert wrapper.wait(30) == -signal.SIGTERM  # reaped here: the adopted handle is not its parent
    outcome = await handle.wait()
    assert (outcome.exit_code, outcome.signal) == (None, signal.SIGTERM)
    assert json.loads(exit_file.read_text()) == {"signal": signal.SIGTERM}
    assert wrapper_pid(str(exit_file)) is None  # the outcome replaced the pid: no stale pid to reuse


def test_the_pid_file_of_an_older_wrapper_is_read_too(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit.json"
    assert wrapper_pid(str(exit_file)) is None
    Path(f"{exit_file}.pid").write_text("4242")
    assert wrapper_pid(str(exit_file)) == 4242
