"""``gpuquota trace export`` from a PostgreSQL log (the distributed mode's) and from SQLite.

The log is written by the core itself: the worked example's configuration and three jobs of QS3
(one instance): "ok" runs 40 s, "bad" then fails after 25 s with exit code 3, and "waiting" has just
started when the log ends (its duration is a lower bound: 0 s).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.adapters.sqlite_store import STORE_FILE, SqliteEventStore
from gpuquota.core import ClusterState, step
from gpuquota.entrypoints.cli import main
from gpuquota.sim.config import load_configuration
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobSpec

CONFIG = load_configuration(Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml")
T0 = 1_700_000_000_000


async def record(store: EventStore, pool: str) -> None:
    state = ClusterState(10**12)
    seq = 0

    async def feed(kind: type[Any], at: int, **fields: Any) -> None:
        nonlocal seq
        message = kind(event_id=str(uuid.uuid4()), occurred_at=T0 + at, **fields)
        seq = await store.append(pool, seq, message, step(state, message))

    async def end(name: str, at: int, status: str, exit_code: int | None = None) -> None:
        job = state.jobs[name]
        assert job.attempt_id is not None
        await feed(
            inp.AttemptReport, at, node_id=job.placements[0].node_id, job_id=name,
            attempt_id=job.attempt_id, status=status, exit_code=exit_code,
        )  # fmt: skip

    for kind, fields in CONFIG.setup():
        await feed(kind, 0, **fields)
    for name, at in (("ok", 1_000), ("bad", 2_000), ("waiting", 3_000)):
        spec = JobSpec(
            job_id=name, job_name=name, job_queue=CONFIG.queue.name, quota_share="QS3", priority=2,
            unit="ml.g5.xlarge", created_at=T0 + at,
        )  # fmt: skip
        await feed(inp.SubmitJob, at, job=spec)
    await end("ok", 41_000, "SUCCEEDED")  # ran 40 s; "bad" starts now
    await end("bad", 66_000, "FAILED", exit_code=3)  # ran 25 s; "waiting" starts now


def check(out: Path) -> None:
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [
        {"submitted_at": 0.0, "share": "QS3", "priority": 2, "unit": "ml.g5.xlarge", "instances": 1,
         "duration": 40.0, "exit_code": 0, "job_name": "ok"},
        {"submitted_at": 1.0, "share": "QS3", "priority": 2, "unit": "ml.g5.xlarge", "instances": 1,
         "duration": 25.0, "exit_code": 3, "job_name": "bad"},
        {"submitted_at": 2.0, "share": "QS3", "priority": 2, "unit": "ml.g5.xlarge", "instances": 1,
         "duration": 0.0, "exit_code": 0, "job_name": "waiting"},
    ]  # fmt: skip


def test_export_from_sqlite(tmp_path: Path) -> None:
    async def write() -> None:
        store = await SqliteEventStore.open(tmp_path / STORE_FILE)
        try:
            await record(store, "default")
        finally:
            await store.close()

    asyncio.run(write())
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "export", "--data-dir", str(tmp_path), "-o", str(out)]) == 0
    check(out)
    assert main(["trace", "export", "--data-dir", str(tmp_path), "--queue", "nope", "-o", str(out)]) == 0
    assert out.read_text() == ""


@pytest.mark.integration
def test_export_from_postgresql(tmp_path: Path, database_url: str) -> None:
    pool = f"export-{uuid.uuid4().hex[:12]}"

    async def write() -> None:
        store = await PostgresEventStore.connect(database_url)
        try:
            await record(store, pool)
        finally:
            await store.close()

    asyncio.run(write())
    out = tmp_path / "trace.jsonl"
    assert main(["trace", "export", "--database-url", database_url, "--pool", pool, "-o", str(out)]) == 0
    check(out)
