"""The event store of the distributed mode: PostgreSQL through an asyncpg pool.

Theory of operation
-------------------
The schema is the packaged migrations (``0001_event_log.sql``, ``0002_input_log.sql``), applied by
``connect``. The log is the ``inputs`` table: one row per decided input, holding the input and its
events as jsonb, keyed by ``(pool, input_seq)``; ``input_seq`` is the store's ``seq``. Each event is
also written to ``events`` (per-pool event position, unique ``event_id``, the input it came from),
where it can be queried and where a decided event id can never be recorded twice.

``append`` is ONE statement (so one implicit transaction and one round trip): data-modifying CTEs
insert the input row, its event rows and the consumer position, all or nothing. The checks are the
database's constraints, so they also hold between processes:

* sequence: the input row is ``(pool, expected_seq + 1)``, inserted only if row ``expected_seq``
  exists (no gaps); a second writer with the same ``expected_seq`` violates the primary key. It
  waits on the first writer's index entry and fails when that one commits: exactly one wins.
* duplicate: ``inputs.input_id`` is unique (across pools).

``append_many`` is ONE statement too: the same CTEs over ``unnest`` of one array parameter per column
insert all the batch's rows (input rows ``expected_seq + 1 ...``, their events numbered on from the
pool's last event, and per partition the last entry's position), so a batch costs one round trip and
one commit however long it is; a constraint violation by any row aborts the whole statement.

Any failed append is classified afterwards by asking whether ``input_id`` is recorded: if it is,
the input is a duplicate (also when the writer was stale, as the in-memory twin does); otherwise the
writer was stale (for a batch: if any of its inputs is recorded, ``DuplicateInput`` names it).
Connection failures, and the errors of a server that shuts down, crashed, recovers, has no connection
left or has just failed over (``TRANSIENT_ERRORS``), become ``TransientStoreError``; after one the
append may or may not have committed, and a retry then answers ``DuplicateInput`` if it had.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import asyncpg

from gpuquota.adapters.event_store import (
    BatchEntry,
    DuplicateInput,
    EventStore,
    EventStoreError,
    Record,
    Snapshot,
    StaleWriter,
    TransientStoreError,
    first_repeated,
)
from gpuquota.adapters.log_codec import decode_record, encode_events, encode_input
from gpuquota.adapters.migrate import apply_migrations

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # 57P0x: the server shuts down, crashed ("terminating connection because of crash of another server
    # process", what every session gets when a backend is killed) or is still recovering
    asyncpg.exceptions.OperatorInterventionError,
    # 53xxx: too many connections (a restarted server while clients reconnect), out of memory or disk
    asyncpg.exceptions.InsufficientResourcesError,
    # a failover: the old primary answers read-only, or a transaction lost to the new one
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.TransactionRollbackError,
    # a connection whose server went away in the middle of an operation ("cannot switch to state 12;
    # another operation (2) is in progress", seen when the server is SIGKILLed; the pool's connections
    # are expired with it, ``_transient``, so the retry gets a fresh one), and, its subclass, no server
    # of the URL's hosts answers as ``target_session_attrs`` asks (a failover under way)
    asyncpg.InternalClientError,
)

_APPEND_MANY = """
WITH batch AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::int[], $6::bigint[], $7::text[], $8::text[])
        WITH ORDINALITY AS b(input_id, topic, part, next_offset, data, events, n)
), ins AS (
    INSERT INTO inputs
        (pool, input_seq, input_id, source_topic, source_partition, source_offset, data, events)
    SELECT $1, $2::bigint + b.n, b.input_id, b.topic, b.part, b.next_offset - 1, b.data::jsonb,
           b.events::jsonb
    FROM batch AS b
    WHERE $2::bigint = 0 OR EXISTS (SELECT 1 FROM inputs WHERE pool = $1 AND input_seq = $2::bigint)
    ORDER BY b.n
    RETURNING input_seq, events
), evs AS (
    INSERT INTO events (pool, seq, event_id, event_type, schema_version, occurred_at, data, input_seq)
    SELECT $1, base.seq + row_number() OVER (ORDER BY ins.input_seq, e.n), e.data->>'event_id',
           e.data->>'type', (e.data->>'schema_version')::smallint,
           to_timestamp((e.data->>'occurred_at')::bigint / 1000.0), e.data, ins.input_seq
    FROM ins,
         (SELECT COALESCE(MAX(seq), 0) AS seq FROM events WHERE pool = $1) AS base,
         jsonb_array_elements(ins.events) WITH ORDINALITY AS e(data, n)
), pos AS (
    INSERT INTO consumer_positions (pool, topic, partition, next_offset)
    SELECT DISTINCT ON (b.topic, b.part) $1, b.topic, b.part, b.next_offset
    FROM batch AS b
    WHERE b.topic IS NOT NULL AND EXISTS (SELECT 1 FROM ins)
    ORDER BY b.topic, b.part, b.n DESC
    ON CONFLICT (pool, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset
)
SELECT count(*) FROM ins
"""

_READ = """
SELECT input_seq, data, events FROM inputs
WHERE pool = $1 AND input_seq > $2 ORDER BY input_seq LIMIT $3
"""


async def _keep_session(connection: Any) -> None:
    """Pool release hook: nothing to reset. The store never changes session state (no SET, LISTEN,
    cursors or advisory locks), and asyncpg's default reset costs a round trip per query."""


@asynccontextmanager
async def _transient(pool: Any) -> AsyncIterator[None]:
    """Driver errors of an unreachable, restarting or failed-over server become ``TransientStoreError``."""
    try:
        yield
    except TRANSIENT_ERRORS as exc:
        if pool is not None and isinstance(exc, asyncpg.InternalClientError):
            await pool.expire_connections()  # none of them is trusted any more
        raise TransientStoreError(f"postgres: {exc!r}") from exc


class PostgresEventStore(EventStore):
    """``EventStore`` on PostgreSQL. Create it with ``await PostgresEventStore.connect(dsn)``."""

    def __init__(self, pool: Any, keep_snapshots: int = 2) -> None:
        self._pool = pool
        self._keep_snapshots = max(1, keep_snapshots)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        schema: str | None = None,
        min_size: int = 1,
        max_size: int = 4,
        migrate: bool = True,
        keep_snapshots: int = 2,
    ) -> PostgresEventStore:
        """Opens a pool (tables in ``schema`` if given, which must exist) and applies the migrations."""
        settings = {} if schema is None else {"search_path": '"' + schema.replace('"', '""') + '"'}
        async with _transient(None):
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, server_settings=settings, reset=_keep_session
            )
        store = cls(pool, keep_snapshots)
        if migrate:
            try:
                async with _transient(pool), pool.acquire() as conn:
                    await apply_migrations(conn)
            except BaseException:
                await pool.close()
                raise
        return store

    async def append_many(self, pool: str, expected_seq: int, entries: Sequence[BatchEntry]) -> int:
        if not entries:
            return expected_seq
        ids = [message.event_id for message, _, _ in entries]
        repeated = first_repeated(ids)
        if repeated is not None:
            raise DuplicateInput(repeated)
        topics: list[str | None] = []
        partitions: list[int | None] = []
        offsets: list[int | None] = []
        for _, _, position in entries:
            topics.append(None if position is None else position.topic)
            partitions.append(None if position is None else position.partition)
            offsets.append(None if position is None else position.next_offset)
        inputs = [encode_input(message) for message, _, _ in entries]
        events = [encode_events(decided) for _, decided, _ in entries]
        args = (pool, expected_seq, ids, topics, partitions, offsets, inputs, events)
        async with _transient(self._pool):
            try:
                count = await self._pool.fetchval(_APPEND_MANY, *args)
            except asyncpg.UniqueViolationError as exc:
                await self._refuse(pool, expected_seq, ids, exc.constraint_name)
            if count != len(entries):
                await self._refuse(pool, expected_seq, ids, None)
        return expected_seq + len(entries)

    async def recorded_inputs(self, input_ids: Sequence[str]) -> set[str]:
        sql = "SELECT input_id FROM inputs WHERE input_id = ANY($1::text[])"
        async with _transient(self._pool):
            rows = await self._pool.fetch(sql, list(input_ids))
        return {row[0] for row in rows}

    async def _refuse(
        self, pool: str, expected_seq: int, input_ids: list[str], constraint: str | None
    ) -> NoReturn:
        """Raises the error that explains why an append did not insert its row(s)."""
        recorded = await self.recorded_inputs(input_ids)
        if recorded:
            raise DuplicateInput(next(i for i in input_ids if i in recorded))
        if constraint == "events_event_id_key":
            raise EventStoreError(f"pool {pool}: an event id of input(s) {input_ids[:3]} is already recorded")
        last = await self.last_seq(pool)
        raise StaleWriter(f"pool {pool}: expected sequence {expected_seq}, log is at {last}")

    async def last_seq(self, pool: str) -> int:
        sql = "SELECT COALESCE(MAX(input_seq), 0) FROM inputs WHERE pool = $1"
        async with _transient(self._pool):
            return int(await self._pool.fetchval(sql, pool))

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        async with _transient(self._pool):
            rows = await self._pool.fetch(_READ, pool, after_seq, limit)
        return [decode_record(row[0], row[1], row[2]) for row in rows]

    async def positions(self, pool: str) -> dict[tuple[str, int], int]:
        sql = "SELECT topic, partition, next_offset FROM consumer_positions WHERE pool = $1"
        async with _transient(self._pool):
            rows = await self._pool.fetch(sql, pool)
        return {(row[0], row[1]): row[2] for row in rows}

    async def pools_at(self, topic: str, partition: int) -> list[str]:
        """The pools with a recorded consumer position on ``(topic, partition)`` (scheduler recovery)."""
        sql = "SELECT pool FROM consumer_positions WHERE topic = $1 AND partition = $2 ORDER BY pool"
        async with _transient(self._pool):
            rows = await self._pool.fetch(sql, topic, partition)
        return [row[0] for row in rows]

    async def save_snapshot(self, pool: str, snapshot: Snapshot) -> None:
        async with _transient(self._pool), self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO snapshots (pool, seq, schema_version, state) VALUES ($1, $2, $3, $4)
                   ON CONFLICT (pool, seq) DO UPDATE
                   SET schema_version = EXCLUDED.schema_version, state = EXCLUDED.state,
                       created_at = now()""",
                pool, snapshot.seq, snapshot.schema_version, snapshot.state,
            )  # fmt: skip
            # keep the newest few: an older one is only useful if the newest cannot be loaded
            await conn.execute(
                """DELETE FROM snapshots WHERE pool = $1 AND seq NOT IN
                   (SELECT seq FROM snapshots WHERE pool = $1 ORDER BY seq DESC LIMIT $2)""",
                pool, self._keep_snapshots,
            )  # fmt: skip

    async def latest_snapshot(self, pool: str) -> Snapshot | None:
        sql = "SELECT seq, schema_version, state FROM snapshots WHERE pool = $1 ORDER BY seq DESC LIMIT 1"
        async with _transient(self._pool):
            row = await self._pool.fetchrow(sql, pool)
        return None if row is None else Snapshot(seq=row[0], schema_version=row[1], state=bytes(row[2]))

    async def close(self) -> None:
        await self._pool.close()
