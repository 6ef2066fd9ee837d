"""The exit wrappers (``exit_wrapper.c`` compiled, ``exit_wrapper.py``), run as the process runtime runs
them: what they record, what the command inherits, how they end. Every test runs against both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpuquota.node_agent import native_wrapper


def wrap(wrapper: tuple[str, ...], tmp_path: Path, *command: str) -> tuple[int, dict[str, object], str]:
    exit_file = tmp_path / "exit.json"
    done = subprocess.run([*wrapper, str(exit_file), *command], capture_output=True, text=True, timeout=30)
    return done.returncode, json.loads(exit_file.read_text()), done.stdout


def test_the_pid_record_then_the_exit_code_in_one_file(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    """While the command runs the exit file names the wrapper's pid; its outcome then replaces that
    record in place (padded with spaces): no other file is made."""
    exit_file = tmp_path / "exit.json"
    command = ["sh", "-c", f"cat {exit_file}; exit 3"]
    with subprocess.Popen([*exit_wrapper, str(exit_file), *command], stdout=subprocess.PIPE) as proc:
        seen, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert json.loads(seen) == {"pid": proc.pid}
    assert json.loads(exit_file.read_text()) == {"exit_code": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit.json"]


def test_a_short_outcome_covers_a_longer_pid_record(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    """``{"signal": 9}`` is shorter than most pid records: the rest is spaces, not the pid's digits."""
    code, doc, _ = wrap(exit_wrapper, tmp_path, "sh", "-c", "kill -KILL $$")
    assert (code, doc) == (-9, {"signal": 9})


def test_a_signal_is_recorded_and_raised_again(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    code, doc, _ = wrap(exit_wrapper, tmp_path, "sh", "-c", "kill -TERM $$")
    assert (code, doc) == (-15, {"signal": 15})


def test_sigpipe_ends_the_wrapper_too(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    """Python ignores SIGPIPE in its own process: the wrapper still ends by it, as the command did."""
    code, doc, _ = wrap(exit_wrapper, tmp_path, "sh", "-c", "kill -PIPE $$")
    assert (code, doc) == (-13, {"signal": 13})


def test_a_missing_command_is_127_with_the_error(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    code, doc, _ = wrap(exit_wrapper, tmp_path, "no-such-command-for-the-wrapper")
    assert (code, doc["exit_code"]) == (127, 127)
    assert doc["error"] == "[Errno 2] No such file or directory: 'no-such-command-for-the-wrapper'"


def test_the_command_gets_default_signal_dispositions(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    """Not ignored: SIGPIPE, SIGXFSZ (Python ignores them), SIGTERM, SIGINT, SIGHUP (the wrapper's own
    handlers); here the parent (pytest) ignores SIGPIPE too."""
    code, doc, out = wrap(exit_wrapper, tmp_path, "grep", "SigIgn", "/proc/self/status")
    assert (code, doc) == (0, {"exit_code": 0})
    ignored = int(out.split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        assert not ignored & (1 << (sig - 1)), sig.name


def test_the_command_shares_the_group_environment_and_directory(
    exit_wrapper: tuple[str, ...], tmp_path: Path
) -> None:
    script = 'echo "$(ps -o pgid= $$) $PPID $MARK $(pwd)"'
    with subprocess.Popen(
        [*exit_wrapper, str(tmp_path / "exit.json"), "sh", "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MARK": "inherited"},
        start_new_session=True,
    ) as proc:
        out, _ = proc.communicate(timeout=30)
    assert out.split() == [str(proc.pid), str(proc.pid), "inherited", str(tmp_path)]


def test_sigterm_to_the_group_waits_for_the_command(exit_wrapper: tuple[str, ...], tmp_path: Path) -> None:
    """The wrapper outlives SIGTERM while the command handles it, then records how the command ended."""
    ready, done = tmp_path / "ready", tmp_path / "done"
    command = textwrap.dedent(
        f"""
        import pathlib, signal, sys, time
        def bye(*_):
            time.sleep(0.2)
            pathlib.Path({str(done)!r}).write_text("yes")
            sys.exit(5)
        signal.signal(signal.SIGTERM, bye)
        pathlib.Path({str(ready)!r}).write_text("ok")
        time.sleep(60)
        """
    )
    exit_file = tmp_path / "exit.json"
    with subprocess.Popen(
        [*exit_wrapper, str(exit_file), sys.executable, "-c", command], start_new_session=True
    ) as proc:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 5
    assert done.exists()
    assert json.loads(exit_file.read_text()) == {"exit_code": 5}


def test_the_runtime_uses_the_compiled_wrapper_when_built() -> None:
    from gpuquota.node_agent.runtime import ProcessRuntime

    expected = native_wrapper.native_command() or native_wrapper.python_command()
    assert ProcessRuntime().exit_wrapper == expected
