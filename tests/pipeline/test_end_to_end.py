"""The distributed mode end to end: gateway -> Kafka -> faust scheduler -> PostgreSQL -> Kafka -> node agent
(simulated runtime) -> Kafka -> scheduler, on the real broker and database."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpuquota.adapters.kafka import KafkaTopics
from gpuquota.client.events import EventsClient, Transition
from gpuquota.entrypoints.distributed import DistributedStack
from gpuquota.entrypoints.local_s3 import S3Client
from gpuquota.node_agent import SimulatedRuntime
from gpuquota.wire import events as ev
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.node_commands import NODE_COMMAND_ADAPTER, RunAttempt
from tests.gateway.helpers import G5, payload, status, submit, worked_example
from tests.pipeline.conftest import TopicReader, wait_until
from tests.pipeline.services import batch_client

pytestmark = pytest.mark.integration

SIM = {"GPUQUOTA_SIM_DURATION_SECONDS": "0.3"}


@pytest_asyncio.fixture
async def stack(
    kafka_bootstrap: str, database_url: str, topics: KafkaTopics, pool: str, run_id: str, tmp_path: Path
) -> AsyncIterator[DistributedStack]:
    slots = tuple(SlotOffer(unit=G5) for _ in range(3))
    made = DistributedStack(
        kafka_bootstrap,
        database_url,
        port=0,
        nodes=[(f"node-{run_id}", slots)],
        runtime=SimulatedRuntime(),
        data_dir=tmp_path,
        topics=topics,
        pool=pool,
        heartbeat_seconds=1.0,
        s3_client=S3Client("http://127.0.0.1:9000", ("local-key", "local-secret")),  # as up --s3 local
    )
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


async def test_submit_to_succeeded_over_kafka(stack: DistributedStack, reader: Any) -> None:
    batch = batch_client(stack.url)
    await asyncio.to_thread(worked_example, batch)
    job_id = await asyncio.to_thread(
        submit, batch, "train", "QS1", serviceRequestPayload=payload(Environment=SIM)
    )

    seen: list[str] = []

    async def succeeded() -> bool:
        current = await asyncio.to_thread(status, batch, job_id)
        if not seen or seen[-1] != current:
            seen.append(current)
        return current == "SUCCEEDED"

    await wait_until(succeeded, 30, "the job to succeed")
    assert seen[-1] == "SUCCEEDED" and set(seen) <= {"SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING",
                                                     "RUNNING", "SUCCEEDED"}  # fmt: skip

    # the job-state topic tells the whole story, in order, keyed by job id
    topic: TopicReader = await reader(stack.topics.job_state)
    records = await topic.until(lambda rs: any(b"JobSucceeded" in (r.value or b"") for r in rs), 20, "events")
    mine = [json.loads(r.value or b"") for r in records if r.key == job_id.encode()]
    assert [m["type"] for m in mine] == [
        "JobAccepted", "JobDispatched", "JobStarting", "JobRunning", "JobSucceeded",
    ]  # fmt: skip
    assert len({m["event_id"] for m in mine}) == len(mine)

    # exactly one RunAttempt reached the node, and the agent ran the attempt once
    commands = await reader(stack.topics.node_commands)
    runs = [
        NODE_COMMAND_ADAPTER.validate_json(r.value or b"") for r in await commands.until(bool, 10, "commands")
    ]
    assert [(c.job_id, c.attempt_number) for c in runs if isinstance(c, RunAttempt)] == [(job_id, 1)]
    (agent,) = stack.agents
    assert agent.link.delivered == 1


async def test_events_client_submits_reprioritises_and_follows(
    stack: DistributedStack, kafka_bootstrap: str, pool: str
) -> None:
    batch = batch_client(stack.url)
    await asyncio.to_thread(worked_example, batch)
    async with EventsClient(kafka_bootstrap, pool=pool, topic_prefix=stack.topics.prefix) as client:
        other = await client.submit(
            job_queue="jq", quota_share="QS1", job_name="other",
            payload={"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}, "Environment": SIM},
        )  # fmt: skip
        job_id = await client.submit(
            job_queue="jq", quota_share="QS2", job_name="mine",
            payload={"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}, "Environment": SIM},
        )  # fmt: skip
        await client.update_priority(job_id, 7)

        got: list[Transition] = []

        async def follow() -> None:
            async for transition in client.transitions(queue="jq", share="QS2"):
                got.append(transition)
                if transition.terminal:
                    return

        await asyncio.wait_for(follow(), 30)

    assert {t.job_id for t in got} == {job_id} and job_id != other
    assert [t.status.value for t in got] == ["RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"]
    assert all((t.job_queue, t.quota_share) == ("jq", "QS2") for t in got)
    assert isinstance(got[1].event, ev.JobDispatched)

    async def reprioritised() -> bool:
        described = await asyncio.to_thread(batch.describe_service_job, jobId=job_id)
        return bool(described["schedulingPriority"] == 7)

    await wait_until(reprioritised, 10, "the new priority in the read model")


async def test_the_env_endpoint_names_the_agents_s3_and_its_key(stack: DistributedStack) -> None:
    def get() -> Any:  # in a thread: the stack serves on this test's loop
        with urllib.request.urlopen(stack.url + "/gpuquota/v1/env", timeout=10) as answer:
            return json.loads(answer.read())

    env = await asyncio.to_thread(get)
    assert env["endpoints"] == {"s3": "http://127.0.0.1:9000"}
    assert env["s3Key"] == {"accessKeyId": "local-key", "secretAccessKey": "local-secret"}
