"""``kill -9`` of PostgreSQL and a restart during many short jobs (issue #30; distributed mode:
``gpuquota scheduler`` and a ``gpuquota node-agent`` process over the real Kafka, the gateway in this
process, all on a PostgreSQL of the test's own with production durability, ``PrivatePostgres``).

Every server process of the database is SIGKILLed while jobs stream through, and the database is
started again after ``OUTAGE_SECONDS`` (crash recovery replays the WAL: nothing committed is lost).
Meanwhile the scheduler retries its append at bounded back-off, deciding nothing; its inputs wait on
Kafka, unacknowledged; the gateway still takes submissions (they are on Kafka) and its readiness
names the database. Once the database is back everything resumes by itself. Checked, from the jobs'
own start and end markers and from the log:

- the scheduler and the gateway never exited; the gateway's read model caught up and was never
  rebuilt (a durable log only grows);
- no two runs of one job overlap, no job runs again after it finished, never more processes than slots;
- every acknowledged job is terminal exactly once, no attempt ran twice, no capacity is held
  (``faults.check_events``), and List shows every job SUCCEEDED;

and the time from the database's return until a job ends again and the read model is caught up.
The scheduler's and the gateway's ``/health/ready`` name the database while it is away.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.e2e.conftest import G5, Cluster, apoll
from tests.e2e.faults import check_events, settle, setup_queue
from tests.e2e.private_postgres import PrivatePostgres
from tests.e2e.short_jobs import ended, examine, read_runs, submit_marking_jobs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_SECONDS = 2.0
SLOTS = 16
JOBS = 300
OUTAGE_SECONDS = 8.0
"""How long the database stays down (its restart and crash recovery come on top)."""


@pytest_asyncio.fixture
async def durable_postgres(tmp_path: Path) -> AsyncIterator[PrivatePostgres]:
    made = PrivatePostgres(tmp_path / "pg")
    try:
        await asyncio.to_thread(made.start)
    except Exception as exc:
        pytest.skip(f"no PostgreSQL of the test's own: {exc}")
    try:
        yield made
    finally:
        await asyncio.to_thread(made.stop)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def readiness(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/health/ready") as answer:
        return answer.status, await answer.json()


def succeeded_listed(batch: Any) -> set[str]:
    found: set[str] = set()
    for page in batch.get_paginator("list_service_jobs").paginate(jobQueue="jq", jobStatus="SUCCEEDED"):
        found.update(summary["jobId"] for summary in page["jobSummaryList"])
    return found


async def test_postgres_killed_and_restarted_during_short_jobs(
    kafka_bootstrap: str, durable_postgres: PrivatePostgres, tmp_path: Path
) -> None:
    durability = await durable_postgres.settings()
    assert durability == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
    out = tmp_path / "out"
    out.mkdir()
    cluster = Cluster(kafka_bootstrap, durable_postgres.url, tmp_path, heartbeat_seconds=HEARTBEAT_SECONDS)
    ops = f"http://127.0.0.1:{free_port()}"  # the scheduler's /health/*
    cluster.scheduler.env["GPUQUOTA_METRICS_PORT"] = ops.rsplit(":", 1)[1]
    try:
        await cluster.start()
        node = cluster.node_id("a")
        await cluster.agent(node, f"{G5}={SLOTS}").start()
        await apoll(lambda: cluster.online() == {node}, 30, "the node to register")
        url = cluster.gateway.url
        await asyncio.to_thread(setup_queue, url, SLOTS)

        submitting = asyncio.ensure_future(
            asyncio.to_thread(submit_marking_jobs, cluster.batch, tmp_path, JOBS)
        )

        def ended_at_least(count: int) -> bool:
            return ended(out) >= count

        await apoll(functools.partial(ended_at_least, JOBS // 3), 300, f"{JOBS // 3} jobs to end", 0.2)
        crashed = time.monotonic()
        await asyncio.to_thread(durable_postgres.crash)

        async def names_the_database(service: str) -> bool:
            status, body = await readiness(service)
            return status == 503 and "database" in str(body.get("checks", body))

        await apoll(functools.partial(names_the_database, url), 30, "the gateway's readiness to fail", 0.2)
        await apoll(functools.partial(names_the_database, ops), 30, "the scheduler's readiness to fail", 0.2)
        await asyncio.sleep(max(0.0, crashed + OUTAGE_SECONDS - time.monotonic()))  # the fault's length
        assert cluster.scheduler.alive, "the scheduler exited while the database was away"
        restart_seconds = await asyncio.to_thread(durable_postgres.restart)
        back, before = time.monotonic(), ended(out)
        outage = back - crashed

        await apoll(functools.partial(ended_at_least, before + 1), 120, "a job to end after the restart", 0.1)
        job_ended = time.monotonic() - back
        projector = cluster.gateway.projector
        assert projector is not None and cluster.gateway.store is not None
        store = cluster.gateway.store

        async def caught_up() -> bool:
            caught = projector.seq == await store.last_seq(cluster.pool)
            return caught and (await readiness(url))[0] == 200 and (await readiness(ops))[0] == 200

        await apoll(caught_up, 60, "the read model to catch up and the gateway to be ready", 0.1)
        read_model_back = time.monotonic() - back

        acknowledged = await submitting
        jobs = list(acknowledged.values())
        await settle(url, jobs, 300, cluster.logs)
        await apoll(lambda: all(r.end is not None for r in read_runs(out)), 30, "every run to end")
        findings = examine(read_runs(out), SLOTS)
        figures = check_events(await cluster.events(), tmp_path, acknowledged)
        figures.recovery_seconds = [job_ended, read_model_back]
        print(
            f"FAULT PostgreSQL kill -9 during {JOBS} short jobs: down {outage:.1f} s (restart and crash "
            f"recovery {restart_seconds:.1f} s), a job ended {job_ended:.1f} s and the read model caught "
            f"up {read_model_back:.1f} s after it was back; {findings.line()}"
        )
        print(figures.line(f"PostgreSQL kill -9 during {JOBS} short jobs"))
        findings.check(JOBS)
        assert await asyncio.to_thread(succeeded_listed, cluster.batch) == set(jobs)  # List is not frozen
        assert cluster.scheduler.alive, "the scheduler exited"
        assert projector.failure is None and projector.rebuilds == 0
        said = cluster.scheduler.log_path.read_text(errors="replace")
        assert "store unavailable" in said, "the scheduler did not say that the database was away"
    finally:
        print(cluster.logs())
        await cluster.stop()
