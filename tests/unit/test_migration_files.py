"""The packaged SQL migrations are well-formed (no database needed)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from gpuquota.adapters.migrate import load_migrations

ROOT = Path(__file__).resolve().parents[2]


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert migrations[0].name == "event_log"


def test_event_log_schema_has_the_tables() -> None:
    sql = load_migrations()[0].sql
    for table in ("events", "inputs", "consumer_positions", "snapshots"):
        assert re.search(rf"CREATE TABLE {table} \(", sql), table


def test_sql_files_are_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "**/*.sql" in pyproject["tool"]["setuptools"]["package-data"]["gpuquota"]
