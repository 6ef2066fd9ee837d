"""``gpuquota up --preemption-grace``: the flag, else ``GPUQUOTA_PREEMPTION_GRACE``, else 30 s."""

from __future__ import annotations

import argparse

import pytest

from gpuquota.entrypoints.embedded import grace


def test_the_flag_wins_then_the_variable_then_30s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUQUOTA_PREEMPTION_GRACE", raising=False)
    assert grace(argparse.Namespace(preemption_grace=None)) == 30.0
    monkeypatch.setenv("GPUQUOTA_PREEMPTION_GRACE", "5")
    assert grace(argparse.Namespace(preemption_grace=None)) == 5.0
    assert grace(argparse.Namespace(preemption_grace=2.5)) == 2.5
    with pytest.raises(ValueError, match="0 to 86400 seconds"):
        grace(argparse.Namespace(preemption_grace=-1.0))
    monkeypatch.setenv("GPUQUOTA_PREEMPTION_GRACE", "soon")
    with pytest.raises(ValueError):
        grace(argparse.Namespace(preemption_grace=None))
