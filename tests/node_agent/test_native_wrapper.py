"""The build of the C exit wrapper (``make native``) and the choice between it and the Python one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuquota.node_agent import native_wrapper


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build writes under ``tmp_path``, not beside the package (whose build the other tests use)."""
    compiled = tmp_path / "_compiled"
    monkeypatch.setattr(native_wrapper, "COMPILED", compiled)
    monkeypatch.setattr(native_wrapper, "BINARY", compiled / "exit-wrapper")
    monkeypatch.setattr(native_wrapper, "DIGEST_FILE", compiled / "exit-wrapper.sha256")
    return compiled


def test_the_build_is_used_until_its_source_changes(
    build_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if native_wrapper.compiler() is None:
        pytest.skip("no C compiler here")
    assert native_wrapper.command() == native_wrapper.python_command()
    assert native_wrapper.build(quiet=True) == 0
    assert native_wrapper.command() == (str(build_dir / "exit-wrapper"),)
    exit_file = tmp_path / "exit.json"
    done = subprocess.run([*native_wrapper.command(), str(exit_file), "true"], timeout=30)
    assert done.returncode == 0 and json.loads(exit_file.read_text()) == {"exit_code": 0}
    edited = tmp_path / "exit_wrapper.c"
    edited.write_text(native_wrapper.SOURCE.read_text() + "\n/* edited */\n")
    monkeypatch.setattr(native_wrapper, "SOURCE", edited)
    assert native_wrapper.command() == native_wrapper.python_command(), "a stale build must not run"


def test_without_a_compiler_the_build_fails_softly(
    build_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(build_dir))  # no cc, no gcc
    monkeypatch.delenv("CC", raising=False)
    assert native_wrapper.build(quiet=True) == 1
    assert "the Python exit wrapper will run" in capsys.readouterr().err
    assert native_wrapper.command() == native_wrapper.python_command()
