"""``kill -9`` of a node agent three times during many short jobs (issue #30; distributed mode:
``gpuquota scheduler`` and ``gpuquota node-agent`` processes over the real Kafka and PostgreSQL).

Each job is a tiny Python process that appends ``start``, then ``end`` (or ``term`` on SIGTERM) with
the time, its pid and its attempt id to a file of its own, and sleeps 0.2 to 1 s in between. The agent
is killed while RunAttempt commands stream in and started again at once (well before the node-lost
timeout), so every kind of attempt is caught: delivered but not yet recorded, recorded but not yet
launched, running, ended but not yet reported. From the jobs' own markers the test then checks:

- no two runs of one job overlap (the scheduler never starts a job again while its old attempt may run);
- no job runs again after one of its runs ended by itself (a job that finished never runs again);
- at no instant do more job processes run than the node has slots (a sweep over the intervals);
- every run ended (by itself or SIGTERM: nothing was left running);

and ``faults.check_events`` on the log (each job terminal once, no attempt ran twice, no capacity held).
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import G5, ClusterFactory, apoll
from tests.e2e.faults import check_events, settle, setup_queue
from tests.e2e.short_jobs import ended, examine, marking_payload, read_runs
from tests.gateway.helpers import submit

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_SECONDS = 2.0
SLOTS = 16
JOBS = 400
KILLS = 3


async def test_kill_9_of_the_agent_three_times_during_short_jobs(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cluster = await cluster_factory(HEARTBEAT_SECONDS, grace=2.0)
    node = cluster.node_id("a")
    slots = f"{G5}={SLOTS}"
    agent = cluster.agent(node, slots)
    await agent.start()
    await apoll(lambda: cluster.online() == {node}, 30, "the node to register")
    url = cluster.gateway.url
    await asyncio.to_thread(setup_queue, url, SLOTS)

    def submit_all() -> dict[str, str]:
        acknowledged = {}
        for i in range(JOBS):
            sleep = 0.2 + 0.8 * ((i * 7) % 10) / 9  # 0.2 to 1 s
            payload = marking_payload(tmp_path, sleep)
            acknowledged[f"j{i}"] = submit(
                cluster.batch, f"j{i}", "QS", serviceRequestPayload=payload, clientToken=f"j{i}"
            )
        return acknowledged

    submitting = asyncio.ensure_future(asyncio.to_thread(submit_all))

    def ended_at_least(count: int) -> bool:
        return ended(out) >= count

    recoveries = []
    for k in range(1, KILLS + 1):
        share = k * JOBS // (KILLS + 1)
        await apoll(functools.partial(ended_at_least, share), 300, f"{share} jobs to end", 0.2)
        await agent.kill()
        killed, before = time.monotonic(), ended(out)
        agent = cluster.agent(node, slots, log_name=f"a-{k}")
        await agent.start()
        await apoll(functools.partial(ended_at_least, before + 1), 120, "a job to end after the restart", 0.1)
        recoveries.append(time.monotonic() - killed)

    acknowledged = await submitting
    jobs = list(acknowledged.values())
    await settle(url, jobs, 300, cluster.logs)
    await apoll(lambda: all(r.end is not None for r in read_runs(out)), 30, "every run to end")
    findings = examine(read_runs(out), SLOTS)
    print(f"FAULT kill -9 of the node agent x{KILLS} during {JOBS} short jobs: {findings.line()}")
    print(f"  recovery (kill to the next job ended): {', '.join(f'{r:.1f} s' for r in recoveries)}")
    figures = check_events(await cluster.events(), tmp_path, acknowledged)
    figures.recovery_seconds = recoveries
    print(figures.line(f"kill -9 of the node agent x{KILLS} during {JOBS} short jobs"))
    findings.check(JOBS)
