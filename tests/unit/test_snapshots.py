"""Snapshots of the core state: exact round trip, and a refused version means "rebuild from the log"."""

from __future__ import annotations

import pytest

from gpuquota.adapters import snapshots
from gpuquota.adapters.snapshots import SnapshotError, SnapshotVersionMismatch, dump_state, load_state
from gpuquota.core import fingerprint
from gpuquota.native import loader as _native
from tests.builders import Harness, job


def busy_cluster() -> Harness:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("b").share("QS2"), job("c").share("QS3").priority(5))
    h.running("a", "b").submit(job("d").share("QS1").priority(7), job("e").share("QS2"))
    return h


def twin(original: Harness, data: bytes) -> Harness:
    """A harness at the same clock and id counter as ``original``, on the state loaded from ``data``."""
    copy = Harness()
    copy.state, copy.now, copy.serial = load_state(data), original.now, original.serial
    return copy


def drive(h: Harness) -> list[object]:
    """More inputs after the snapshot: submissions that preempt, stop reports, starts, a timer tick."""
    start = len(h.events)
    h.submit(job("f").share("QS3").priority(9), job("g").share("QS1"))
    h.stop_all_preempted()
    h.running(*sorted(j.job_id for j in h.state.jobs.values() if j.status == "SCHEDULED"))
    h.tick(60_000)
    return list(h.events[start:])


def test_dump_load_keeps_the_state_and_it_keeps_deciding_the_same() -> None:
    original = busy_cluster()
    loaded = twin(original, dump_state(original.state))

    assert fingerprint(loaded.state) == fingerprint(original.state)
    assert drive(loaded) == drive(original)
    assert fingerprint(loaded.state) == fingerprint(original.state)


def test_another_schema_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = dump_state(busy_cluster().state)
    monkeypatch.setattr(snapshots, "SNAPSHOT_SCHEMA_VERSION", snapshots.SNAPSHOT_SCHEMA_VERSION + 1)

    with pytest.raises(SnapshotVersionMismatch, match="rebuild the state from the log"):
        load_state(data)


def test_a_snapshot_of_the_other_kind_of_core_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = dump_state(busy_cluster().state)
    other = "python (forced)" if _native.core_mode() == "compiled" else "compiled"
    monkeypatch.setattr(_native, "_mode", other)

    with pytest.raises(SnapshotVersionMismatch, match="core: ignore the snapshot and rebuild"):
        load_state(data)


def test_bytes_without_a_header_are_refused() -> None:
    with pytest.raises(SnapshotError, match="not a gpuquota snapshot"):
        load_state(b'{"jobs": {}}')
