"""``exit_wrapper.py``, run as the process runtime runs it: what it records, what the command inherits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from gpuquota.node_agent.runtime import WRAPPER


def wrap(tmp_path: Path, *command: str) -> tuple[int, dict[str, object], str]:
    exit_file = tmp_path / "exit.json"
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(WRAPPER), str(exit_file), *command],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, json.loads(exit_file.read_text()), done.stdout


def test_exit_code_and_pid_file(tmp_path: Path) -> None:
    code, doc, _ = wrap(tmp_path, "sh", "-c", "exit 3")
    assert (code, doc) == (3, {"exit_code": 3})
    assert int((tmp_path / "exit.json.pid").read_text()) > 0


def test_a_signal_is_recorded_and_raised_again(tmp_path: Path) -> None:
    code, doc, _ = wrap(tmp_path, "sh", "-c", "kill -TERM $$")
    assert (code, doc) == (-15, {"signal": 15})


def test_a_missing_command_is_127_with_the_error(tmp_path: Path) -> None:
    code, doc, _ = wrap(tmp_path, "no-such-command-for-the-wrapper")
    assert code == 127 and doc["exit_code"] == 127 and "No such file" in str(doc["error"])


def test_the_command_gets_default_signal_dispositions(tmp_path: Path) -> None:
    """Not ignored: SIGPIPE (Python ignores it), SIGTERM, SIGINT, SIGHUP (the wrapper's own handlers)."""
    code, doc, out = wrap(tmp_path, "grep", "SigIgn", "/proc/self/status")
    assert (code, doc) == (0, {"exit_code": 0})
    ignored = int(out.split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        assert not ignored & (1 << (sig - 1)), sig.name
