"""A node declared lost while its agent is alive comes back by itself (real processes, both modes).

The link from the node agent to the scheduler is cut for longer than the heartbeat timeout (a network
partition, a long pause) while the pool's other node reports: the scheduler declares the node lost and
requeues its attempt (S5.7), while the attempt's process keeps running on the node. When the link
heals, the agent's next heartbeat is rejected (``InputRejected`` naming the node) and the scheduler
answers ``RegisterAgain``: the agent
registers again and re-reports the attempt it still runs, the scheduler fences it (``AttemptFenced`` ->
``StopAttempt``: SIGTERM), runs the requeued job again on the node, and new jobs run there too.

Embedded mode: ``EmbeddedStack`` (``gpuquota up``). Distributed mode (``integration``): the
``DistributedStack`` of ``gpuquota up --kafka ...`` in this process, so the test can cut its node
agent's link; commands reach the agent over the node-commands topic.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuquota.adapters.kafka import KafkaTopics, ensure_topics
from gpuquota.core.state import ClusterState
from gpuquota.entrypoints.distributed import DistributedStack
from gpuquota.entrypoints.embedded import EmbeddedStack, node_slots
from gpuquota.node_agent import NodeAgent, ProcessRuntime, procs
from gpuquota.wire import events as ev
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput
from tests.e2e.conftest import G5, Jobs, apoll, batch_client, log_events
from tests.gateway.helpers import create_queue, create_share, status, submit

HEARTBEAT_SECONDS = 0.5
TIMEOUT_SECONDS = 6 * HEARTBEAT_SECONDS
SLOTS = f"{G5}=2"
QUIET = "ml.c5.xlarge=1"
"""A second node of the pool that keeps heartbeating (no job asks for its unit): with every node of a
pool silent at once, the scheduler would blame its own link and suspend node loss (full disruption)."""


class Partition:
    """Cuts what ``agent`` sends to the scheduler while ``cut`` (every send fails, as on a dead link)."""

    def __init__(self, agent: NodeAgent) -> None:
        self.cut = False
        self.failed = 0
        self._send = agent.outbox.send
        agent.outbox.send = self.send

    async def send(self, message: SchedulerInput) -> object:
        if self.cut:
            self.failed += 1
            raise ConnectionError("partitioned from the scheduler")
        return await self._send(message)


@dataclass
class Stack:
    url: str
    node_id: str
    agent: NodeAgent
    state: Callable[[], ClusterState]
    """The scheduler's view (embedded: the shell's state; distributed: the gateway's projection)."""
    events: Callable[[], Awaitable[list[SchedulerEvent]]]


StackFactory = Callable[[str], Awaitable[Stack]]


@pytest_asyncio.fixture
async def make_stack(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[StackFactory]:
    stops: list[Callable[[], Awaitable[None]]] = []

    async def embedded() -> Stack:
        stack = EmbeddedStack(
            tmp_path / "stack",
            port=0,
            nodes=f"{SLOTS},{QUIET}",
            runtime="process",
            tick_seconds=0.1,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            preemption_grace=5.0,
        )
        stops.append(stack.stop)
        await stack.start()
        shell, store = stack.shell, stack.store
        assert shell is not None and store is not None
        node_id, agent = next(iter(stack.agents.items()))  # the first node: the one with g5 slots
        return Stack(stack.url, node_id, agent, lambda: shell.state, lambda: log_events(store, "default"))

    async def distributed() -> Stack:
        kafka = request.getfixturevalue("kafka_bootstrap")
        database_url = request.getfixturevalue("database_url")
        run = uuid.uuid4().hex[:10]
        topics, pool = KafkaTopics(f"e2e-{run}."), f"p-{run}"
        await ensure_topics(kafka, topics, partitions=2)
        (_, slots), (_, quiet) = node_slots(f"{SLOTS},{QUIET}")
        stack = DistributedStack(
            kafka,
            database_url,
            port=0,
            # unique: the agent commits offsets to a group named after it
            nodes=[(f"node-{run}", slots), (f"quiet-{run}", quiet)],
            runtime=ProcessRuntime(),
            data_dir=tmp_path / "stack",
            topics=topics,
            pool=pool,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            preemption_grace=5.0,
        )
        stops.append(stack.stop)
        await stack.start()
        gateway = stack.gateway
        assert gateway.projector is not None and gateway.store is not None
        projector, store = gateway.projector, gateway.store
        service = stack.agents[0]
        return Stack(
            stack.url, f"node-{run}", service.agent, lambda: projector.state, lambda: log_events(store, pool)
        )

    async def make(mode: str) -> Stack:
        return await (embedded() if mode == "embedded" else distributed())

    try:
        yield make
    finally:
        for stop in stops:
            await stop()


@pytest.mark.parametrize("mode", ["embedded", pytest.param("distributed", marks=pytest.mark.integration)])
async def test_node_lost_while_alive_registers_again_by_itself(
    mode: str, make_stack: StackFactory, jobs: Jobs
) -> None:
    stack = await make_stack(mode)
    node, agent = stack.node_id, stack.agent
    partition = Partition(agent)
    batch: Any = batch_client(stack.url)
    try:

        def online() -> bool:
            found = stack.state().nodes.get(node)
            return found is not None and found.online

        async def is_running() -> bool:
            return await asyncio.to_thread(status, batch, moved) == "RUNNING"

        async def is_runnable() -> bool:
            return await asyncio.to_thread(status, batch, moved) == "RUNNABLE"

        def setup() -> str:
            create_queue(batch, capacity=2)
            create_share(batch, "QS", "RESERVE", limit=2)
            return submit(batch, "moved", "QS", serviceRequestPayload=jobs.trainer())

        await apoll(online, 60, "the node to register")
        moved = await asyncio.to_thread(setup)
        first = await asyncio.to_thread(jobs.started, "moved", 1)
        assert first["node"] == node
        await apoll(is_running, 30, "moved RUNNING")

        # the partition: nothing the agent sends arrives; the scheduler loses the node
        partition.cut = True
        cut_at = time.time()
        await apoll(lambda: not online(), 30, "the node to be declared lost")
        await apoll(is_runnable, 30, "moved RUNNABLE")
        assert procs.pid_alive(first["pid"]), "the lost attempt's process runs on"
        assert partition.failed > 0

        # the link heals: the node registers again by itself, the orphan is fenced, the job runs again
        partition.cut = False
        await apoll(online, 30, "the node to register again")
        second = await apoll(lambda: jobs.marker("moved", 2, "start"), 60, "moved to run again")
        assert second["node"] == node and second["attempt_id"] != first["attempt_id"]
        await apoll(lambda: not procs.pid_alive(first["pid"]), 30, "the orphan to be stopped")
        assert jobs.marker("moved", 1, "term") is not None, "the orphan did not get SIGTERM"
        await apoll(is_running, 30, "moved RUNNING again")

        # a new job runs on the node
        fresh = await asyncio.to_thread(submit, batch, "fresh", "QS", serviceRequestPayload=jobs.trainer())
        started = await asyncio.to_thread(jobs.started, "fresh", 1)
        assert started["node"] == node
        jobs.finish("moved")
        jobs.finish("fresh")

        async def both_succeeded() -> bool:
            found = await asyncio.to_thread(lambda: {status(batch, j) for j in (moved, fresh)})
            return found == {"SUCCEEDED"}

        await apoll(both_succeeded, 60, "both jobs to succeed")

        events = await stack.events()
        (lost,) = [e for e in events if isinstance(e, ev.NodeLost)]
        assert (lost.node_id, lost.reason) == (node, f"Node {node} lost")
        waited = lost.occurred_at / 1000 - cut_at
        assert TIMEOUT_SECONDS - 2 * HEARTBEAT_SECONDS <= waited < 30, waited
        (requeued,) = [e for e in events if isinstance(e, ev.JobRequeued)]
        assert (requeued.job_id, requeued.cause) == (moved, "NODE_LOST")
        rejected = [e for e in events if isinstance(e, ev.InputRejected)]
        assert rejected and {(e.input_type, e.node_id) for e in rejected} == {("NodeHeartbeat", node)}
        registered = [e for e in events if isinstance(e, ev.NodeRegistered)]
        assert len(registered) >= 2 and registered[-1].occurred_at > lost.occurred_at
        fenced = {(e.node_id, e.job_id, e.attempt_id) for e in events if isinstance(e, ev.AttemptFenced)}
        assert fenced == {(node, moved, first["attempt_id"])}
        assert agent.registrations >= 2
        assert jobs.starts("moved") == [1, 2] and jobs.starts("fresh") == [1]
    finally:
        batch.close()
