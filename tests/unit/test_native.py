"""The compiled core is used exactly when it was built from the current sources."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuquota.native import loader as _native


def mode_in_subprocess(**env: str) -> str:
    code = "from gpuquota.native import loader as _native; import gpuquota.core; print(_native.core_mode())"
    result = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_ci_runs_the_compiled_core() -> None:
    """`make test` builds it first (`make native`): in CI a failed build must not pass unnoticed."""
    if not os.environ.get("CI") or os.environ.get(_native.PURE_ENV):
        pytest.skip("checked in CI, where `make test` builds the compiled core")
    assert _native.core_mode() == "compiled"


def test_the_python_core_can_be_forced() -> None:
    assert mode_in_subprocess(**{_native.PURE_ENV: "1"}) == f"python ({_native.PURE_ENV} is set)"


def test_a_build_of_other_sources_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _native.DIGEST_FILE.exists():
        pytest.skip("no compiled core here (make native)")
    monkeypatch.delenv(_native.PURE_ENV, raising=False)
    monkeypatch.setattr(_native, "sources_digest", lambda: "edited since the build")
    monkeypatch.setattr(_native, "_mode", "unset")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    before = list(sys.meta_path)

    _native.install()

    assert _native.core_mode().startswith("python (the compiled core is older than the sources")
    assert sys.meta_path == before
