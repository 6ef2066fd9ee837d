"""The event store of the embedded mode: one SQLite file, stdlib ``sqlite3``.

Theory of operation
-------------------
``sqlite3`` blocks, so every call that may wait runs on one private worker thread that owns the
store's connection; the event loop only awaits. One thread also means those calls of one store object
run one after another.

Appends are the exception: they run on the event loop's thread, on a second connection (the
*writer*) that never waits for a lock. An append's own work is a fraction of a millisecond (the
commit writes the WAL without syncing it), but handing it to the worker thread cost several: the
thread needs the GIL back after each statement, and a busy event loop gives it up only every
switch interval (5 ms). The writer's busy timeout is zero, so when another connection holds the
write lock the append is handed to the worker thread, which waits for the lock as every other call
does. Checkpoints, which sync the files, run on the worker thread too (``CHECKPOINT_BYTES``): the
writer's automatic checkpoints are off.

``append`` (and ``append_many``, for a batch) is one ``BEGIN IMMEDIATE`` transaction: it takes
SQLite's write lock *before* reading, so the sequence check (is the pool's last ``seq`` still
``expected_seq``?) cannot be overtaken by another connection to the same file before the insert. An
input recorded before is refused by ``UNIQUE (input_id)`` during the insert (looking first cost a
query per batch); only then, or when the sequence is stale, does the append look for which one it was
(a duplicate is reported before a stale sequence). ``PRIMARY KEY (pool, seq)`` backs the sequence up.

Each row of ``inputs`` holds one input and the events decided for it (JSON), so reading the log is
one indexed range scan per page. The file runs in WAL mode with ``synchronous=NORMAL``: a commit
survives a crash of the process, but the last commits before an OS crash or power loss may be lost
(the inputs are then redelivered from Kafka and decided again).

A write the file system refuses (``SQLITE_FULL``: the disk is full; ``SQLITE_IOERR``: an I/O error;
``SQLITE_READONLY``, ``SQLITE_CANTOPEN``) is ``StoreWriteFailed``: the transaction is rolled back
and nothing of the append committed, but the file stays readable and the writer usable, so the next
append succeeds once the disk has room again (``_write_error``). Every other ``OperationalError`` is
a ``TransientStoreError``, retried by the loop.

The schema version is ``PRAGMA user_version``; ``open`` creates the schema in an empty file and
refuses a file written by a newer schema.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gpuquota.adapters.event_store import (
    BatchEntry,
    DuplicateInput,
    EventStore,
    EventStoreError,
    Position,
    Record,
    Snapshot,
    StaleWriter,
    StoreWriteFailed,
    TransientStoreError,
    first_repeated,
)
from gpuquota.adapters.log_codec import decode_record, encode_events, encode_input

T = TypeVar("T")
log = logging.getLogger(__name__)

WRITE_ERRORS = frozenset(
    {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN}
)
"""Primary result codes of a write the file system refused (the extended codes of an I/O error,
``SQLITE_IOERR_WRITE`` and the like, keep the primary one in their low byte)."""

CHECKPOINT_BYTES = 4 * 1024 * 1024
"""Appended since the last checkpoint, in bytes of JSON, before the worker thread runs the next one
(about SQLite's own automatic checkpoint: 1,000 pages of 4 KiB)."""

STORE_FILE = "events.sqlite3"
"""The event log's file name in a data directory (``gpuquota up --data-dir``)."""
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE inputs (
    pool             TEXT    NOT NULL,
    seq              INTEGER NOT NULL CHECK (seq >= 1),
    input_id         TEXT    NOT NULL UNIQUE,
    source_topic     TEXT,
    source_partition INTEGER,
    source_offset    INTEGER,
    data             TEXT    NOT NULL,
    events           TEXT    NOT NULL,
    PRIMARY KEY (pool, seq)
) WITHOUT ROWID;
CREATE TABLE consumer_positions (
    pool        TEXT    NOT NULL,
    topic       TEXT    NOT NULL,
    partition   INTEGER NOT NULL CHECK (partition >= 0),
    next_offset INTEGER NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (pool, topic, partition)
) WITHOUT ROWID;
CREATE TABLE snapshots (
    pool           TEXT    NOT NULL,
    seq            INTEGER NOT NULL CHECK (seq >= 0),
    schema_version INTEGER NOT NULL,
    state          BLOB    NOT NULL,
    PRIMARY KEY (pool, seq)
);
"""


class SqliteEventStore(EventStore):
    """``EventStore`` on one SQLite file. Create it with ``await SqliteEventStore.open(path)``."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        conn: sqlite3.Connection,
        writer: sqlite3.Connection,
        keep_snapshots: int,
    ) -> None:
        self._executor = executor
        self._conn = conn
        self._writer = writer  # the event loop's thread only
        self._keep_snapshots = keep_snapshots
        self._closed = False
        self._handed_over = 0  # appends waiting on the worker thread for another writer's lock
        self._since_checkpoint = 0
        self._checkpoint: asyncio.Future[None] | None = None

    @classmethod
    async def open(cls, path: str | Path, *, keep_snapshots: int = 2) -> SqliteEventStore:
        """Opens (creating the file and schema if needed); keeps the newest ``keep_snapshots`` per pool."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-event-store")
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, _connect, str(path))
            try:
                writer = await loop.run_in_executor(executor, _connect_writer, str(path))
            except BaseException:
                conn.close()
                raise
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(executor, conn, writer, max(1, keep_snapshots))

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn)
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk I/O error, ...
            raise TransientStoreError(f"sqlite: {exc}") from exc

    async def append_many(self, pool: str, expected_seq: int, entries: Sequence[BatchEntry]) -> int:
        """Several inputs in one transaction: one commit for all, on the event loop's thread."""
        if not entries:
            return expected_seq
        rows = [
            (message.event_id, encode_input(message), encode_events(events), position)
            for message, events, position in entries
        ]
        size = sum(len(data) + len(events) for _, data, events, _ in rows)
        if not self._handed_over:
            try:
                last = _append_many(self._writer, pool, expected_seq, rows)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                    raise _write_error(exc) from exc
            else:
                self._written(size)
                return last
        # Another connection writes: wait for its lock on the worker thread, not here. Appends after
        # this one go there too while it waits, so that they stay in order.
        self._handed_over += 1
        executor = asyncio.get_running_loop().run_in_executor
        try:
            last = await executor(self._executor, _append_many, self._conn, pool, expected_seq, rows)
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk full, ...
            raise _write_error(exc) from exc
        finally:
            self._handed_over -= 1
        self._written(size)
        return last

    def _written(self, size: int) -> None:
        """Count ``size`` bytes appended; start a checkpoint on the worker thread once enough are."""
        self._since_checkpoint += size
        if self._since_checkpoint < CHECKPOINT_BYTES or self._checkpoint is not None:
            return
        self._since_checkpoint = 0
        self._checkpoint = asyncio.ensure_future(self._call(_checkpoint))
        self._checkpoint.add_done_callback(self._checkpointed)

    def _checkpointed(self, done: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if not done.cancelled() and done.exception() is not None:
            log.warning("sqlite checkpoint failed: %r", done.exception())

    async def recorded_inputs(self, input_ids: Sequence[str]) -> set[str]:
        ids = list(input_ids)
        return await self._call(lambda conn: _recorded(conn, ids))

    async def last_seq(self, pool: str) -> int:
        return await self._call(lambda conn: _last_seq(conn, pool))

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        return await self._call(lambda conn: _read(conn, pool, after_seq, limit))

    async def positions(self, pool: str) -> dict[tuple[str, int], int]:
        sql = "SELECT topic, partition, next_offset FROM consumer_positions WHERE pool = ?"
        rows = await self._call(lambda conn: conn.execute(sql, (pool,)).fetchall())
        return {(topic, partition): offset for topic, partition, offset in rows}

    async def pools_at(self, topic: str, partition: int) -> list[str]:
        sql = "SELECT pool FROM consumer_positions WHERE topic = ? AND partition = ? ORDER BY pool"
        rows = await self._call(lambda conn: conn.execute(sql, (topic, partition)).fetchall())
        return [pool for (pool,) in rows]

    async def save_snapshot(self, pool: str, snapshot: Snapshot) -> None:
        await self._call(lambda conn: _save_snapshot(conn, pool, snapshot, self._keep_snapshots))

    async def latest_snapshot(self, pool: str) -> Snapshot | None:
        sql = "SELECT seq, schema_version, state FROM snapshots WHERE pool = ? ORDER BY seq DESC LIMIT 1"
        row = await self._call(lambda conn: conn.execute(sql, (pool,)).fetchone())
        return None if row is None else Snapshot(seq=row[0], schema_version=row[1], state=bytes(row[2]))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])
        self._writer.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)


def _write_error(exc: sqlite3.OperationalError) -> EventStoreError:
    """What a failed append means to the loop: the file system refused the write (``WRITE_ERRORS``:
    not retried), or anything else (locked past the busy timeout, ...: retried)."""
    if (exc.sqlite_errorcode & 0xFF) in WRITE_ERRORS:
        return StoreWriteFailed(f"{exc} (SQLite {exc.sqlite_errorname})")
    return TransientStoreError(f"sqlite: {exc}")


# ----- worker-thread functions ---------------------------------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; append issues BEGIN IMMEDIATE itself.
    conn = sqlite3.connect(path, timeout=10.0, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        _ensure_schema(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_writer(path: str) -> sqlite3.Connection:
    """The appending connection, for the event loop's thread: it never waits for a lock (timeout 0)
    and never checkpoints (``_checkpoint`` does, on the worker thread)."""
    conn = sqlite3.connect(path, timeout=0.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
    except BaseException:
        conn.close()
        raise
    return conn


def _checkpoint(conn: sqlite3.Connection) -> None:
    """Copy the WAL into the database file as far as no reader needs it (never waits)."""
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def _ensure_schema(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")  # two processes opening a new file: one creates, one waits
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise EventStoreError(f"sqlite event store schema is {version}; this code knows {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _last_seq(conn: sqlite3.Connection, pool: str) -> int:
    row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM inputs WHERE pool = ?", (pool,)).fetchone()
    return int(row[0])


def _recorded(conn: sqlite3.Connection, input_ids: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(input_ids), 500):  # SQLite's limit on host parameters is 999 before 3.32
        chunk = input_ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(f"SELECT input_id FROM inputs WHERE input_id IN ({marks})", chunk).fetchall()
        found.update(input_id for (input_id,) in rows)
    return found


def _append_many(
    conn: sqlite3.Connection,
    pool: str,
    expected_seq: int,
    rows: list[tuple[str, str, str, Position | None]],
) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        ids = [row[0] for row in rows]
        repeated = first_repeated(ids)
        if repeated is not None:
            raise DuplicateInput(repeated)
        last = _last_seq(conn, pool)
        if last != expected_seq:
            _refuse_recorded(conn, ids)  # a duplicate is reported before a stale sequence
            raise StaleWriter(f"pool {pool}: expected sequence {expected_seq}, log is at {last}")
        try:
            conn.executemany(
                "INSERT INTO inputs (pool, seq, input_id, source_topic, source_partition, source_offset,"
                " data, events) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (pool, expected_seq + n, input_id, *_source(position), data, events)
                    for n, (input_id, data, events, position) in enumerate(rows, start=1)
                ],
            )
        except sqlite3.IntegrityError:  # UNIQUE (input_id): the usual append does not look first
            conn.execute("ROLLBACK")  # then this batch's own rows are not among those found
            _refuse_recorded(conn, ids)
            raise
        positions = {(p.topic, p.partition): p.next_offset for *_, p in rows if p is not None}
        conn.executemany(
            "INSERT INTO consumer_positions (pool, topic, partition, next_offset) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (pool, topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
            [(pool, topic, partition, offset) for (topic, partition), offset in positions.items()],
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return expected_seq + len(rows)


def _refuse_recorded(conn: sqlite3.Connection, input_ids: list[str]) -> None:
    """``DuplicateInput`` for the first of ``input_ids`` that is recorded already, if any."""
    found = _recorded(conn, input_ids)
    if found:
        raise DuplicateInput(next(i for i in input_ids if i in found))


def _source(position: Position | None) -> tuple[str | None, int | None, int | None]:
    """The ``source_*`` columns: where the input was read (the position is the offset after it)."""
    if position is None:
        return (None, None, None)
    return (position.topic, position.partition, position.next_offset - 1)


def _read(conn: sqlite3.Connection, pool: str, after_seq: int, limit: int) -> list[Record]:
    rows = conn.execute(
        "SELECT seq, data, events FROM inputs WHERE pool = ? AND seq > ? ORDER BY seq LIMIT ?",
        (pool, after_seq, limit),
    ).fetchall()
    return [decode_record(seq, data, events) for seq, data, events in rows]


def _save_snapshot(conn: sqlite3.Connection, pool: str, snapshot: Snapshot, keep: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "INSERT OR REPLACE INTO snapshots (pool, seq, schema_version, state) VALUES (?, ?, ?, ?)",
            (pool, snapshot.seq, snapshot.schema_version, snapshot.state),
        )
        conn.execute(
            "DELETE FROM snapshots WHERE pool = ? AND seq NOT IN"
            " (SELECT seq FROM snapshots WHERE pool = ? ORDER BY seq DESC LIMIT ?)",
            (pool, pool, keep),
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
