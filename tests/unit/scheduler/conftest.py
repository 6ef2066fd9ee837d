"""Snapshots of these tests' small states are never paced: where a snapshot falls must not depend on
how fast the machine dumps (pacing has its own test, ``test_snapshots_are_paced_by_...``)."""

from __future__ import annotations

import pytest

from gpuquota.scheduler import pacing


@pytest.fixture(autouse=True)
def unpaced_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "_CHEAP_DUMP_SECONDS", float("inf"))
