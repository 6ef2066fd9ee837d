"""The SQLite store appends on the event loop's thread, on a connection that never waits for a lock:
when another connection writes, the append waits for it on the store's worker thread instead; the
WAL is checkpointed on that thread (``adapters.sqlite_store``)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpuquota.adapters import sqlite_store
from gpuquota.adapters.event_store import DuplicateInput, Record, StaleWriter
from gpuquota.adapters.sqlite_store import SqliteEventStore
from tests.contract.test_event_store import sample_log


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        yield opened
    finally:
        await opened.close()


async def test_an_append_waits_for_another_writer_off_the_event_loop(
    store: SqliteEventStore, tmp_path: Path
) -> None:
    (first, first_events), (second, second_events), *_ = sample_log()
    other = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock
    append = asyncio.create_task(store.append("p", 0, first, first_events))
    ticks = 0
    while not append.done() and ticks < 50:  # the loop keeps running meanwhile
        await asyncio.sleep(0.01)
        ticks += 1
    assert not append.done()
    after = asyncio.create_task(store.append("p", 1, second, second_events))  # queues behind it
    await asyncio.sleep(0)
    other.execute("ROLLBACK")
    other.close()
    assert await asyncio.wait_for(append, 30) == 1
    assert await asyncio.wait_for(after, 30) == 2
    assert await store.read("p") == [Record(1, first, first_events), Record(2, second, second_events)]


async def test_the_wal_is_checkpointed_on_the_worker_thread(
    store: SqliteEventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "events.db"
    before = database.stat().st_size
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_BYTES", 1)
    log = sample_log()
    seq = 0
    for message, events in log:
        seq = await store.append("p", seq, message, events)
    deadline = asyncio.get_running_loop().time() + 30
    while database.stat().st_size == before and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # the database file grows only by a checkpoint
    assert database.stat().st_size > before
    assert len(await store.read("p")) == len(log)


async def test_a_recorded_batch_appended_again_is_a_duplicate_not_a_stale_sequence(
    store: SqliteEventStore,
) -> None:
    log = [(message, events, None) for message, events in sample_log()[:3]]
    assert await store.append_many("p", 0, log) == 3
    with pytest.raises(DuplicateInput) as refused:  # a retry of an append that had committed
        await store.append_many("p", 0, log)
    assert str(refused.value) == log[0][0].event_id
    with pytest.raises(StaleWriter):
        await store.append_many("p", 0, [(m, e, None) for m, e in sample_log("new-")[:1]])
