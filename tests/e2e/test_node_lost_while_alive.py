"""A node declared lost while its agent is alive comes back by itself (embedded mode, real processes).

The link from the node agent to the scheduler is cut for longer than the heartbeat timeout (a network
partition, a long pause): the scheduler declares the node lost and requeues its attempt (S5.7), while
the attempt's process keeps running on the node. When the link heals, the agent's next heartbeat is
rejected (``InputRejected`` naming the node) and the scheduler answers ``RegisterAgain``: the agent
registers again and re-reports the attempt it still runs, the scheduler fences it (``AttemptFenced`` ->
``StopAttempt``: SIGTERM), runs the requeued job again on the node, and new jobs run there too.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from gpuquota.embedded import EmbeddedStack
from gpuquota.node_agent import NodeAgent, procs
from gpuquota.wire import events as ev
from gpuquota.wire.inputs import SchedulerInput
from tests.e2e.conftest import Jobs, apoll, batch_client, log_events
from tests.gateway.helpers import create_queue, create_share, status, submit

HEARTBEAT_SECONDS = 0.5
TIMEOUT_SECONDS = 6 * HEARTBEAT_SECONDS
NODE = "local-1"


class Partition:
    """Cuts what ``agent`` sends to the scheduler while ``cut`` (every send fails, as on a dead link)."""

    def __init__(self, agent: NodeAgent) -> None:
        self.cut = False
        self.failed = 0
        self._send = agent._send
        agent._send = self.send

    async def send(self, message: SchedulerInput) -> object:
        if self.cut:
            self.failed += 1
            raise ConnectionError("partitioned from the scheduler")
        return await self._send(message)


async def test_embedded_node_lost_while_alive_registers_again_by_itself(jobs: Jobs, tmp_path: Path) -> None:
    stack = EmbeddedStack(
        tmp_path / "stack",
        port=0,
        nodes="ml.g5.xlarge=2",
        runtime="process",
        tick_seconds=0.1,
        heartbeat_seconds=HEARTBEAT_SECONDS,
        preemption_grace=5.0,
    )
    await stack.start()
    batch: Any = None
    try:
        assert stack.shell is not None and stack.store is not None
        shell, agent = stack.shell, stack.agents[NODE]
        partition = Partition(agent)
        batch = batch_client(stack.url)

        def online() -> bool:
            node = shell.state.nodes.get(NODE)
            return node is not None and node.online

        async def is_running() -> bool:
            return await asyncio.to_thread(status, batch, moved) == "RUNNING"

        def setup() -> str:
            create_queue(batch, capacity=2)
            create_share(batch, "QS", "RESERVE", limit=2)
            return submit(batch, "moved", "QS", serviceRequestPayload=jobs.trainer())

        await apoll(online, 30, "the node to register")
        moved = await asyncio.to_thread(setup)
        first = await asyncio.to_thread(jobs.started, "moved", 1)
        assert first["node"] == NODE
        await apoll(is_running, 30, "moved RUNNING")

        # the partition: nothing the agent sends arrives; the scheduler loses the node
        partition.cut = True
        cut_at = time.time()
        await apoll(lambda: not online(), 30, "the node to be declared lost")
        assert await asyncio.to_thread(status, batch, moved) == "RUNNABLE"
        assert procs.pid_alive(first["pid"]), "the lost attempt's process runs on"
        assert partition.failed > 0

        # the link heals: the node registers again by itself, the orphan is fenced, the job runs again
        partition.cut = False
        await apoll(online, 30, "the node to register again")
        second = await apoll(lambda: jobs.marker("moved", 2, "start"), 60, "moved to run again")
        assert second["node"] == NODE and second["attempt_id"] != first["attempt_id"]
        await apoll(lambda: not procs.pid_alive(first["pid"]), 30, "the orphan to be stopped")
        assert jobs.marker("moved", 1, "term") is not None, "the orphan did not get SIGTERM"
        await apoll(is_running, 30, "moved RUNNING again")

        # a new job runs on the node
        fresh = await asyncio.to_thread(submit, batch, "fresh", "QS", serviceRequestPayload=jobs.trainer())
        started = await asyncio.to_thread(jobs.started, "fresh", 1)
        assert started["node"] == NODE
        jobs.finish("moved")
        jobs.finish("fresh")

        async def both_succeeded() -> bool:
            found = await asyncio.to_thread(lambda: {status(batch, j) for j in (moved, fresh)})
            return found == {"SUCCEEDED"}

        await apoll(both_succeeded, 60, "both jobs to succeed")

        events = await log_events(stack.store, "default")
        (lost,) = [e for e in events if isinstance(e, ev.NodeLost)]
        assert (lost.node_id, lost.reason) == (NODE, f"Node {NODE} lost")
        waited = lost.occurred_at / 1000 - cut_at
        assert TIMEOUT_SECONDS - 2 * HEARTBEAT_SECONDS <= waited < 30, waited
        (requeued,) = [e for e in events if isinstance(e, ev.JobRequeued)]
        assert (requeued.job_id, requeued.cause) == (moved, "NODE_LOST")
        rejected = [e for e in events if isinstance(e, ev.InputRejected)]
        assert rejected and {(e.input_type, e.node_id) for e in rejected} == {("NodeHeartbeat", NODE)}
        registered = [e for e in events if isinstance(e, ev.NodeRegistered)]
        assert len(registered) >= 2 and registered[-1].occurred_at > lost.occurred_at
        fenced = {(e.node_id, e.job_id, e.attempt_id) for e in events if isinstance(e, ev.AttemptFenced)}
        assert fenced == {(NODE, moved, first["attempt_id"])}
        assert agent.registrations >= 2
        assert jobs.starts("moved") == [1, 2] and jobs.starts("fresh") == [1]
    finally:
        if batch is not None:
            batch.close()
        await stack.stop()
