"""The event log loses its last records, as after a failover to an asynchronous replica or a restore
from backup (issue #30; distributed mode: ``gpuquota scheduler`` and a ``gpuquota node-agent`` process
over the real Kafka and PostgreSQL, the gateway in this process).

During many short jobs the scheduler is SIGKILLed and the last ``LOST`` records of the pool's log are
deleted (``cut_tail``: the input rows, their events, the snapshots after the cut, and the consumer
positions back to what the kept records say, as a database restored to that point would hold). Jobs
had been dispatched, had run and had been reported SUCCEEDED in those records, and the node agent
keeps running throughout. Then the scheduler starts again. Expected:

- the gateway's read model notices that the log no longer holds what it folded and rebuilds from it
  (``gateway.log_tail``), and Describe/List catch up;
- the scheduler finds Kafka's committed offset past the log's position and reads the lost inputs
  again (``scheduler.rewind``): every acknowledged submission is decided, the node's reports tell
  what ran, and a job that finished is never run again (``core.lost_tail``);
- from the jobs' own markers: no two runs of one job overlap, no job runs after one of its runs ended
  by itself; from the log: every acknowledged job terminal exactly once, no attempt ran twice, no
  capacity held (``faults.check_events``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from gpuquota.adapters.log_codec import decode_record
from tests.e2e.conftest import G5, ClusterFactory, apoll
from tests.e2e.faults import check_events, settle, setup_queue
from tests.e2e.short_jobs import ended, examine, read_runs, submit_marking_jobs
from tests.e2e.test_database_restart import succeeded_listed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_SECONDS = 2.0
SLOTS = 16
JOBS = 200
LOST = (60, 400)
"""Records cut from the end of the log: a short tail, and one reaching back over most of the run
(about 600 records by then), far behind Kafka's committed offset."""


async def recorded_positions(database_url: str, pool: str, topic: str) -> dict[int, int]:
    """The next offset of ``topic`` per partition that ``pool``'s log has recorded."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            """SELECT source_partition, max(source_offset) + 1 FROM inputs
               WHERE pool = $1 AND source_topic = $2 GROUP BY source_partition""",
            pool, topic,
        )  # fmt: skip
    finally:
        await connection.close()
    return {partition: position for partition, position in rows}


async def committed_reach(kafka: str, group: str, topic: str, positions: dict[int, int]) -> bool:
    """Whether the consumer ``group``'s committed offsets of ``topic`` have reached ``positions``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    committed = {tp.partition: at.offset for tp, at in offsets.items() if tp.topic == topic}
    return all(committed.get(partition, -1) >= position for partition, position in positions.items())


async def cut_tail(database_url: str, pool: str, lost: int) -> dict[str, int]:
    """Delete the last ``lost`` records of ``pool``'s log, as a database restored to the record before
    them holds it; what the cut records held (records, dispatches, successes)."""
    connection = await asyncpg.connect(database_url)
    try:
        async with connection.transaction():
            last = await connection.fetchval("SELECT max(input_seq) FROM inputs WHERE pool = $1", pool)
            keep = last - lost
            rows = await connection.fetch(
                "SELECT input_seq, data, events FROM inputs WHERE pool = $1 AND input_seq > $2", pool, keep
            )
            events = [e for row in rows for e in decode_record(row[0], row[1], row[2]).events]
            await connection.execute("DELETE FROM events WHERE pool = $1 AND input_seq > $2", pool, keep)
            await connection.execute("DELETE FROM inputs WHERE pool = $1 AND input_seq > $2", pool, keep)
            await connection.execute("DELETE FROM snapshots WHERE pool = $1 AND seq > $2", pool, keep)
            await connection.execute("DELETE FROM consumer_positions WHERE pool = $1", pool)
            await connection.execute(
                """INSERT INTO consumer_positions (pool, topic, partition, next_offset)
                   SELECT pool, source_topic, source_partition, max(source_offset) + 1 FROM inputs
                   WHERE pool = $1 AND source_topic IS NOT NULL
                   GROUP BY pool, source_topic, source_partition""",
                pool,
            )
    finally:
        await connection.close()
    return {
        "records": len(rows),
        "dispatches": sum(1 for e in events if e.type == "JobDispatched"),
        "successes": sum(1 for e in events if e.type == "JobSucceeded"),
    }


@pytest.mark.parametrize("lost", LOST)
async def test_a_log_that_lost_its_tail_runs_no_finished_job_again(
    cluster_factory: ClusterFactory, database_url: str, tmp_path: Path, lost: int
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cluster = await cluster_factory(HEARTBEAT_SECONDS, grace=2.0)
    node = cluster.node_id("a")
    await cluster.agent(node, f"{G5}={SLOTS}").start()
    await apoll(lambda: cluster.online() == {node}, 30, "the node to register")
    url = cluster.gateway.url
    await asyncio.to_thread(setup_queue, url, SLOTS)

    submitting = asyncio.ensure_future(asyncio.to_thread(submit_marking_jobs, cluster.batch, tmp_path, JOBS))

    def ended_at_least(count: int) -> bool:
        return ended(out) >= count

    await apoll(functools.partial(ended_at_least, JOBS // 2), 300, f"{JOBS // 2} jobs to end", 0.2)
    # Kafka commits the scheduler's offsets once a second: kill it only once they cover what the log
    # held a moment ago, so that the cut below ends the log before Kafka's committed offset (the case
    # this test is about) rather than leaving the lost inputs after it
    topics = cluster.topics
    positions = await recorded_positions(database_url, cluster.pool, topics.inputs)
    reach = functools.partial(
        committed_reach, cluster.kafka, topics.scheduler_group, topics.inputs, positions
    )
    await apoll(reach, 30, f"the scheduler's committed offsets to reach {positions}", 0.1)
    await cluster.scheduler.kill()
    cut = await cut_tail(database_url, cluster.pool, lost)
    projector = cluster.gateway.projector
    assert projector is not None
    await apoll(lambda: projector.rebuilds >= 1, 30, "the gateway's read model to rebuild")
    restarted = time.monotonic()
    await cluster.scheduler.start()

    acknowledged = await submitting
    jobs = list(acknowledged.values())
    # a job whose submission the log lost is unknown (Describe: "does not exist") until the restarted
    # scheduler has read its input again and decided it
    known = cluster.gateway.read_model.jobs
    await apoll(lambda: all(j in known for j in jobs), 120, "every acknowledged job to be decided", 0.2)
    await settle(url, jobs, 300, cluster.logs)
    recovered = time.monotonic() - restarted
    await apoll(lambda: all(r.end is not None for r in read_runs(out)), 30, "every run to end")
    findings = examine(read_runs(out), SLOTS)
    figures = check_events(await cluster.events(), tmp_path, acknowledged)
    figures.recovery_seconds = [recovered]
    said = cluster.scheduler.log_path.read_text(errors="replace")
    print(
        f"FAULT log tail lost ({cut['records']} records: {cut['dispatches']} dispatches, "
        f"{cut['successes']} successes) during {JOBS} short jobs: every job terminal {recovered:.1f} s"
        f" after the scheduler's restart; read model rebuilt {projector.rebuilds}x; {findings.line()}"
    )
    print(figures.line(f"log tail of {lost} records lost during {JOBS} short jobs"))
    assert cut["successes"] > 0, "the cut held no success: the test proves nothing"
    assert "past the event log's position" in said, "the scheduler did not read the lost inputs again"
    findings.check(JOBS)
    listed: Any = await asyncio.to_thread(succeeded_listed, cluster.batch)
    assert listed == set(jobs)
    assert projector.failure is None
