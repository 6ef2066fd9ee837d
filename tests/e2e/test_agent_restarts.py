"""``kill -9`` of a node agent while its attempts run, and its restart (issue #11; distributed mode:
``gpuquota scheduler`` and ``gpuquota node-agent`` processes over the real Kafka and PostgreSQL).

The agent comes back before the scheduler declares its node lost (heartbeats every 2 s, lost after
12 s). Its registration lists the attempts it finds still running (adopted) and those that ended
meanwhile (by the exit status their wrapper recorded): those the node still offers slots for keep
running and end SUCCEEDED once, by their real exit code. Back with fewer slots, the attempts on the
missing slots are stopped (fenced) and requeued, without counting a retry. The checks are those of
``faults.check_events``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import ClusterFactory, apoll
from tests.e2e.faults import Client, check_events, settle, setup_queue, statuses

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_SECONDS = 2.0


@pytest.mark.parametrize("slots_after", [3, 1])
async def test_kill_9_of_a_node_agent_while_its_attempts_run(
    cluster_factory: ClusterFactory, tmp_path: Path, slots_after: int
) -> None:
    cluster = await cluster_factory(HEARTBEAT_SECONDS)
    node = cluster.node_id("a")
    agent = cluster.agent(node, "ml.g5.xlarge=3")
    await agent.start()
    await apoll(lambda: cluster.online() == {node}, 30, "the node to register")
    url = cluster.gateway.url
    await asyncio.to_thread(setup_queue, url, 3)
    client = Client(lambda: url, tmp_path, 6, ticks=[60])  # 3 s each
    client.start()
    await client.wait(timeout=60)
    jobs = list(client.acknowledged.values())

    async def three_running() -> bool:
        found = await asyncio.to_thread(statuses, url, jobs)
        return sum(s == "RUNNING" for s in found.values()) == 3

    await apoll(three_running, 60, "three jobs to run")
    await agent.kill()
    killed = time.monotonic()
    again = cluster.agent(node, f"ml.g5.xlarge={slots_after}", log_name="a-again")
    await again.start()
    recovery = time.monotonic() - killed
    await settle(url, jobs, 120, cluster.logs)
    figures = check_events(await cluster.events(), tmp_path, client.acknowledged)
    figures.recovery_seconds = [recovery]
    assert node in cluster.online(), "the node is back online"
    print(figures.line(f"kill -9 of a node agent, back with {slots_after} of 3 slots"))
