"""``kill -9`` of a node agent process (distributed mode: ``gpuquota node-agent`` processes over Kafka).

The scheduler process runs with ``GPUQUOTA_HEARTBEAT_SECONDS=0.5``, so it declares a node lost after
3 s (6 periods) without a heartbeat (S5.7): the lost node's job goes back to RUNNABLE (``Node <id>
lost``) and runs on the other agent. The killed agent's job process outlives it (agents leave job
processes running so that a restarted agent can adopt them); when an agent with the same node id
starts again it adopts that process, reports it RUNNING, and the scheduler fences the attempt
(``AttemptFenced`` -> StopAttempt): the process gets SIGTERM and is gone.

Only the distributed mode is covered: in the embedded mode (``gpuquota up`` without Kafka) the node
agents live inside the stack's process and take commands by direct call, with no way for an agent
in another process to join, so one agent cannot be killed on its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from gpuquota.node_agent import procs
from gpuquota.wire import events as ev
from tests.e2e.conftest import ClusterFactory, Jobs, apoll
from tests.gateway.helpers import create_queue, create_share, status, submit

pytestmark = pytest.mark.integration

HEARTBEAT_SECONDS = 0.5
TIMEOUT_SECONDS = 6 * HEARTBEAT_SECONDS


async def test_kill_9_node_agent_jobs_move_and_the_orphan_is_fenced(
    cluster_factory: ClusterFactory, jobs: Jobs
) -> None:
    cluster = await cluster_factory(HEARTBEAT_SECONDS)
    batch = cluster.batch
    doomed, survivor = cluster.node_id("a"), cluster.node_id("b")
    # placement prefers the node with the fewest free slots: the first job lands on ``doomed``
    agent_a = cluster.agent(doomed, "ml.g5.xlarge=1")
    agent_b = cluster.agent(survivor, "ml.g5.xlarge=2")
    await asyncio.gather(agent_a.start(), agent_b.start())
    await apoll(lambda: cluster.online() == {doomed, survivor}, 30, "both nodes to register")

    def setup() -> tuple[str, str]:
        create_queue(batch, capacity=3)
        create_share(batch, "QS", "RESERVE", limit=3)
        moved = submit(batch, "moved", "QS", serviceRequestPayload=jobs.trainer())
        stays = submit(batch, "stays", "QS", serviceRequestPayload=jobs.trainer())
        return moved, stays

    moved, stays = await asyncio.to_thread(setup)
    first = await asyncio.to_thread(jobs.started, "moved", 1)
    other = await asyncio.to_thread(jobs.started, "stays", 1)
    assert (first["node"], other["node"]) == (doomed, survivor)

    # kill -9 the agent of ``doomed``: no clean-up, no DeregisterNode, its job process lives on
    await agent_a.kill()
    killed_at = time.time()
    assert procs.pid_alive(first["pid"])

    second = await apoll(lambda: jobs.marker("moved", 2, "start"), 60, "moved to run again")
    assert second["node"] == survivor and second["attempt_id"] != first["attempt_id"]

    async def moved_running() -> bool:  # its start marker can precede the RUNNING report's projection
        return await asyncio.to_thread(status, batch, moved) == "RUNNING"

    await apoll(moved_running, 30, "moved to be RUNNING again")

    events = await cluster.events()
    (lost,) = [e for e in events if isinstance(e, ev.NodeLost)]
    assert (lost.node_id, lost.reason) == (doomed, f"Node {doomed} lost")
    # not before the heartbeat timeout (the last heartbeat may precede the kill by one period)
    waited = lost.occurred_at / 1000 - killed_at
    assert TIMEOUT_SECONDS - 2 * HEARTBEAT_SECONDS <= waited < 30, waited
    (requeued,) = [e for e in events if isinstance(e, ev.JobRequeued)]
    assert (requeued.job_id, requeued.cause) == (moved, "NODE_LOST")
    assert requeued.status_reason == f"Node {doomed} lost"
    # the orphan of the lost attempt still runs: nothing on the node was left to stop it
    assert procs.pid_alive(first["pid"])

    # an agent with the same node id (same work directory) adopts the orphan; the scheduler fences it
    restarted = cluster.agent(doomed, "ml.g5.xlarge=1", log_name=f"{doomed}-restarted")
    await restarted.start()
    await apoll(lambda: not procs.pid_alive(first["pid"]), 60, "the orphan to be stopped")
    assert jobs.marker("moved", 1, "term") is not None, "the orphan did not get SIGTERM"
    fenced = [e for e in await cluster.events() if isinstance(e, ev.AttemptFenced)]
    assert [(e.node_id, e.job_id, e.attempt_id) for e in fenced] == [(doomed, moved, first["attempt_id"])]
    assert "adopted (pid" in restarted.tail()

    # the jobs finish where they run now; the survivor's job never noticed
    assert procs.pid_alive(second["pid"]) and procs.pid_alive(other["pid"])
    jobs.finish("moved")
    jobs.finish("stays")

    async def both_succeeded() -> bool:
        return await asyncio.to_thread(lambda: {status(batch, j) for j in (moved, stays)}) == {"SUCCEEDED"}

    await apoll(both_succeeded, 60, "both jobs to succeed")
    described = {j: await asyncio.to_thread(batch.describe_service_job, jobId=j) for j in (moved, stays)}
    assert [len(described[j]["attempts"]) for j in (moved, stays)] == [2, 1]
    assert "preemptionSummary" not in described[moved]  # node loss is not a preemption (S5.7)
    dispatched = Counter(e.job_id for e in await cluster.events() if isinstance(e, ev.JobDispatched))
    assert dispatched == {moved: 2, stays: 1}
    assert jobs.starts("moved") == [1, 2] and jobs.starts("stays") == [1]
