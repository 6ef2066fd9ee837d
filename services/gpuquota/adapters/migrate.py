"""Applies the numbered SQL migrations in ``gpuquota/adapters/migrations`` to a PostgreSQL database.

Migration files are named ``NNNN_description.sql`` (``0001_event_log.sql``); versions start at 1
and have no gaps. :func:`apply_migrations` is idempotent and safe to run concurrently from several
processes: it holds a PostgreSQL advisory lock, records applied versions in ``schema_migrations``
and applies each pending file in its own transaction together with its ``schema_migrations`` row.
Tables are created in the connection's ``search_path`` schema.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

#: Key of the session-level advisory lock taken while migrating (the ASCII of "gpuquota").
MIGRATION_LOCK_KEY = int.from_bytes(b"gpuquota", "big") & 0x7FFF_FFFF_FFFF_FFFF

_FILENAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    int         PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """The migration files or the database's migration history are inconsistent."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str = "gpuquota.adapters", directory: str = "migrations") -> list[Migration]:
    """Reads the packaged migration files, sorted by version; checks names and numbering."""
    root = resources.files(package).joinpath(directory)
    found: list[Migration] = []
    for entry in root.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILENAME.match(entry.name)
        if match is None:
            raise MigrationError(f"bad migration file name {entry.name!r}: expected NNNN_description.sql")
        found.append(Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    _check_sequence(found)
    return found


def _check_sequence(migrations: Sequence[Migration]) -> None:
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"migration versions must be 1..n without gaps or duplicates; "
                f"expected {expected:04d}, found {migration.version:04d}_{migration.name}"
            )


async def applied_versions(conn: Any) -> list[int]:
    """Versions recorded in ``schema_migrations``, ascending; empty if the table does not exist."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return []
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    return [int(row["version"]) for row in rows]


async def apply_migrations(conn: Any, migrations: Sequence[Migration] | None = None) -> list[int]:
    """Applies pending migrations on an ``asyncpg.Connection``; returns the versions it applied.

    Raises :class:`MigrationError` if the database records a version this code does not know
    (a newer schema), and re-raises the database error of a failing migration, whose
    transaction is rolled back (earlier migrations stay applied).
    """
    todo = list(load_migrations() if migrations is None else migrations)
    _check_sequence(todo)
    known = {m.version for m in todo}
    applied_now: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        done = set(await applied_versions(conn))
        if not done:  # only then: a role without CREATE (operations.md) can start on a migrated database
            await conn.execute(_CREATE_TABLE)
        unknown = sorted(done - known)
        if unknown:
            raise MigrationError(
                f"database has migrations {unknown} that this code does not know; is the code older?"
            )
        for migration in todo:
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", migration.version)
            log.info("applied migration %04d_%s", migration.version, migration.name)
            applied_now.append(migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied_now
