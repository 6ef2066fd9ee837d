"""The shell while its event log refuses writes (``StoreWriteFailed``: the disk is full, an I/O error).

``RefusingStore`` refuses every append while ``full``, as the SQLite store does on a full disk (its
reads go on), and counts the reads from the start of the log: a rebuild of the state."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from gpuquota.adapters.event_store import (
    InMemoryEventStore,
    Record,
    StoreWriteFailed,
    TransientStoreError,
)
from gpuquota.adapters.sqlite_store import _write_error
from gpuquota.core import fingerprint
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.wire import inputs as inp
from tests.unit.scheduler.test_shell import Clock, eventually, job, rebuilt, setup

FULL = "database or disk is full (SQLite SQLITE_FULL)"


class RefusingStore(InMemoryEventStore):
    def __init__(self) -> None:
        super().__init__()
        self.full = False
        self.refused = 0
        self.batches: list[int] = []
        self.rebuilds = 0

    async def append_many(self, pool: str, expected_seq: int, entries: Any) -> int:
        if self.full:
            self.refused += 1
            raise StoreWriteFailed(FULL)
        self.batches.append(len(entries))
        return await super().append_many(pool, expected_seq, entries)

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        if after_seq == 0:
            self.rebuilds += 1
        return await super().read(pool, after_seq, limit)


async def test_refused_writes_are_answered_with_the_reason_and_leave_no_trace() -> None:
    store = RefusingStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0, store_retry_seconds=0.2)
    await setup(shell)
    assert await shell.handle(shell.make(inp.SubmitJob, job=job("a")))

    store.full = True
    refused = [shell.make(inp.SubmitJob, job=job(f"b{i}")) for i in range(10)]
    outcomes = await asyncio.gather(*(shell.handle(m) for m in refused), return_exceptions=True)
    assert all(isinstance(o, StoreWriteFailed) and str(o) == FULL for o in outcomes), outcomes
    assert shell.failure is None and shell.write_failure == FULL
    assert not {f"b{i}" for i in range(10)} & (set(shell.state.jobs) | set(shell.read_model.jobs))
    assert fingerprint(shell.state) == await rebuilt(store)
    rebuilds = store.rebuilds - 1  # rebuilt() read the log once

    # while refused, inputs go one at a time on the state of the log: a refusal rebuilds nothing
    more = [shell.make(inp.SubmitJob, job=job(f"c{i}")) for i in range(5)]
    outcomes = await asyncio.gather(*(shell.handle(m) for m in more), return_exceptions=True)
    assert all(isinstance(o, StoreWriteFailed) for o in outcomes)
    assert store.rebuilds == rebuilds + 1 and store.refused >= 15
    assert await shell.handle(shell.make(inp.Tick)) == []  # quiet inputs and reads go on
    assert shell.read_model.jobs["a"].status.value in ("RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")

    # space freed: the next input is recorded, the refusal ends by itself, batches resume
    store.full = False
    retried = refused[:3]  # the same inputs again (a client's retry): each recorded once
    assert all(await asyncio.gather(*(shell.handle(m) for m in retried)))
    assert shell.write_failure is None
    fresh = [shell.make(inp.SubmitJob, job=job(f"d{i}")) for i in range(8)]
    assert all(await asyncio.gather(*(shell.handle(m) for m in fresh)))
    assert max(store.batches[-3:]) > 1  # group commit again
    assert await shell.handle(refused[0]) == []  # recorded already: a duplicate
    ids = [r.input.event_id for r in await store.read("default")]
    assert len(ids) == len(set(ids)) and not {m.event_id for m in refused[3:] + more} & set(ids)
    assert {"b0", "b1", "b2"} <= set(shell.read_model.jobs) and "b3" not in shell.read_model.jobs
    assert fingerprint(shell.state) == await rebuilt(store)


async def test_ticks_refused_do_not_fail_the_shell() -> None:
    store = RefusingStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0.01, heartbeat_timeout_ms=50)
    await setup(shell)
    store.full = True
    seq = await store.last_seq("default")
    await shell.start()
    try:
        # the node's heartbeat expires: the tick decides something, and its append is refused
        await eventually(lambda: store.refused >= 3)
        assert shell.failure is None and shell.write_failure == FULL
        store.full = False
        await eventually(lambda: shell.write_failure is None)
        assert await store.last_seq("default") > seq and shell.failure is None
    finally:
        await shell.stop()


def _operational(code: int, name: str) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(name)
    error.sqlite_errorcode = code
    error.sqlite_errorname = name
    return error


def test_sqlite_errors_of_the_file_system_are_refused_writes() -> None:
    for code, name in [
        (sqlite3.SQLITE_FULL, "SQLITE_FULL"),
        (sqlite3.SQLITE_IOERR, "SQLITE_IOERR"),
        (sqlite3.SQLITE_IOERR_WRITE, "SQLITE_IOERR_WRITE"),
        (sqlite3.SQLITE_IOERR_FSYNC, "SQLITE_IOERR_FSYNC"),
        (sqlite3.SQLITE_READONLY, "SQLITE_READONLY"),
    ]:
        error = _write_error(_operational(code, name))
        assert isinstance(error, StoreWriteFailed) and name in str(error)
    for code, name in [(sqlite3.SQLITE_LOCKED, "SQLITE_LOCKED"), (sqlite3.SQLITE_BUSY, "SQLITE_BUSY")]:
        assert isinstance(_write_error(_operational(code, name)), TransientStoreError)
