"""asyncpg applies the packaged migrations (concurrently, idempotently) and round-trips rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
import pytest_asyncio

from gpuquota.adapters.migrate import MigrationError, applied_versions, apply_migrations, load_migrations

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture
async def schema(database_url: str) -> AsyncIterator[str]:
    """A fresh schema per test, dropped afterwards."""
    name = f"it_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE SCHEMA "{name}"')
        yield name
        await admin.execute(f'DROP SCHEMA "{name}" CASCADE')
    finally:
        await admin.close()


async def _connect(database_url: str, schema: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


async def test_migrations_apply_once_and_round_trip(database_url: str, schema: str) -> None:
    versions = [m.version for m in load_migrations()]
    assert versions[0] == 1

    conn_a = await _connect(database_url, schema)
    conn_b = await _connect(database_url, schema)
    try:
        # two concurrent runners: the advisory lock lets exactly one apply each version
        applied = await asyncio.gather(apply_migrations(conn_a), apply_migrations(conn_b))
        assert sorted(applied[0] + applied[1]) == versions
        assert await apply_migrations(conn_a) == []  # idempotent
        assert await applied_versions(conn_a) == versions

        tables = {
            r["table_name"]
            for r in await conn_a.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
            )
        }
        assert {"schema_migrations", "events", "inputs", "consumer_positions", "snapshots"} <= tables

        occurred = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
        data = {"job_id": "j-1", "gpus": 2, "tags": ["a", "b"], "nested": {"x": None}}
        await conn_a.execute(
            """INSERT INTO events (pool, seq, event_id, event_type, schema_version, occurred_at, data)
               VALUES ($1, $2, $3, $4, $5, $6, $7)""",
            "default", 1, "evt-1", "job.submitted", 1, occurred, data,
        )  # fmt: skip
        row = await conn_b.fetchrow("SELECT * FROM events WHERE pool = $1 AND seq = $2", "default", 1)
        assert row is not None
        assert (row["event_id"], row["event_type"], row["schema_version"]) == ("evt-1", "job.submitted", 1)
        assert row["occurred_at"] == occurred
        assert row["data"] == data
        assert row["recorded_at"] is not None

        with pytest.raises(asyncpg.UniqueViolationError):  # event_id is an idempotency key
            await conn_a.execute(
                """INSERT INTO events (pool, seq, event_id, event_type, schema_version, occurred_at, data)
                   VALUES ('default', 2, 'evt-1', 'job.submitted', 1, now(), '{}')"""
            )
        with pytest.raises(asyncpg.UniqueViolationError):  # (pool, seq) is the concurrency check
            await conn_a.execute(
                """INSERT INTO events (pool, seq, event_id, event_type, schema_version, occurred_at, data)
                   VALUES ('default', 1, 'evt-2', 'job.submitted', 1, now(), '{}')"""
            )

        await conn_a.execute(
            """INSERT INTO consumer_positions (pool, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
               ON CONFLICT (pool, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset""",
            "default", "inputs", 0, 42,
        )  # fmt: skip
        assert await conn_b.fetchval("SELECT next_offset FROM consumer_positions") == 42
    finally:
        await conn_a.close()
        await conn_b.close()


async def test_unknown_applied_version_is_refused(database_url: str, schema: str) -> None:
    conn = await _connect(database_url, schema)
    try:
        await apply_migrations(conn)
        await conn.execute("INSERT INTO schema_migrations (version) VALUES (9999)")
        with pytest.raises(MigrationError, match="9999"):
            await apply_migrations(conn)
    finally:
        await conn.close()
