"""Serialization of the core's ``ClusterState`` for snapshots: a version header, then a pickle.

The state is a graph of slotted objects, sorted lists and frozen wire models; pickle keeps it exact
(including the journal cell the records share) and fast. The format is tied to the classes in
``gpuquota.core.records`` and ``gpuquota.core.state``: bump ``SNAPSHOT_SCHEMA_VERSION`` whenever a
change to them (new slots, renamed attributes, different index types) would make an old snapshot load
into a wrong state.
``load_state`` refuses any other version with ``SnapshotVersionMismatch``; the caller then ignores
the snapshot and rebuilds the state by replaying the log.

Unpickling runs code named by the data: load only snapshots this service wrote to its own store.
"""

from __future__ import annotations

import gc
import pickle
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from gpuquota.adapters.event_store import EventStoreError
from gpuquota.core import ClusterState
from gpuquota.native import loader as _native

SNAPSHOT_SCHEMA_VERSION = 11

COMPILED_FLAG = 0x8000
"""Set in the header's version by the compiled core (``gpuquota.native.loader``): mypyc's classes pickle
their attributes differently, so each kind of core reads only its own snapshots (the other kind
rebuilds from the log, as after any version change)."""

MAGIC = b"GPQSNAP"
_HEADER = struct.Struct(">7sH")  # magic, version (unsigned 16 bit, big endian)


class SnapshotError(EventStoreError):
    """The bytes are not a snapshot this code can load; rebuild the state from the log."""


class SnapshotVersionMismatch(SnapshotError):
    """The snapshot was written with another ``SNAPSHOT_SCHEMA_VERSION``."""


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pickling a large state creates or visits millions of objects; the cyclic garbage collector
    would scan the growing heap again and again meanwhile (about half the time of a load)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def dump_state(state: ClusterState) -> bytes:
    """The state as snapshot bytes. Call it between inputs, never inside a ``decide`` trial."""
    if state.journal_cell[0] is not None:
        raise SnapshotError("cannot snapshot a state while a decide trial is open")
    header = _HEADER.pack(MAGIC, _this_version())
    with _collector_paused():
        return header + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def snapshot_version(data: bytes) -> int:
    """The version in the header; ``SnapshotError`` if there is no snapshot header."""
    if len(data) < _HEADER.size:
        raise SnapshotError(f"not a gpuquota snapshot: {len(data)} bytes, shorter than the header")
    magic, version = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError(f"not a gpuquota snapshot: header starts {bytes(data[:7])!r}")
    return int(version)


def _this_version() -> int:
    return SNAPSHOT_SCHEMA_VERSION | (COMPILED_FLAG if _native.core_mode() == "compiled" else 0)


def _describe(version: int) -> str:
    kind = "compiled" if version & COMPILED_FLAG else "Python"
    return f"schema version {version & ~COMPILED_FLAG} of the {kind} core"


def load_state(data: bytes) -> ClusterState:
    """The state saved by ``dump_state``; refuses snapshots of another schema version or core kind."""
    version = snapshot_version(data)
    if version != _this_version():
        raise SnapshotVersionMismatch(
            f"snapshot of {_describe(version)}, this process reads {_describe(_this_version())}: "
            "ignore the snapshot and rebuild the state from the log"
        )
    with _collector_paused():
        state = pickle.loads(memoryview(data)[_HEADER.size :])
    if not isinstance(state, ClusterState):
        raise SnapshotError(f"snapshot holds a {type(state).__name__}, not a ClusterState")
    return state
