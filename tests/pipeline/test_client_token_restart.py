"""A ``clientToken`` retried on a restarted distributed gateway before its first submission is decided.

The distributed gateway knows a token from its read model only, once the scheduler's decision is
folded. If the gateway dies after producing the ``SubmitJob`` and before the client got the answer,
the retry may reach the restarted gateway before the scheduler decided the first try: that gateway
does not know the token. It used to give the retry a new job id, and the core accepted both (one
token, two jobs; AWS Batch makes one). A tokened job's id now comes from the pool and the token
(``gateway.edge.token_job_id``), and the core answers a retry naming an existing job with that job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.kafka import KafkaTopics, ensure_topics
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.entrypoints.distributed import GatewayService
from gpuquota.scheduler.faust_app import SchedulerConfig, SchedulerService
from gpuquota.wire import events as ev
from tests.e2e.conftest import batch_client
from tests.e2e.faults import job_payload, setup_queue

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _submit(url: str, root: Path) -> str:
    def call() -> str:
        batch: Any = batch_client(url)
        try:
            answer = batch.submit_service_job(
                jobName="t1",
                jobQueue="jq",
                serviceJobType="SAGEMAKER_TRAINING",
                quotaShareName="QS",
                serviceRequestPayload=job_payload(root, 0),
                clientToken="t1",
            )
        finally:
            batch.close()
        return str(answer["jobId"])

    return await asyncio.to_thread(call)


async def test_a_token_retried_on_a_restarted_gateway_makes_one_job(
    kafka_bootstrap: str, database_url: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:10]
    topics, pool = KafkaTopics(f"ct{run}."), f"ct-{run}"
    await ensure_topics(kafka_bootstrap, topics, partitions=1)
    config = SchedulerConfig(
        kafka=kafka_bootstrap, database_url=database_url, topics=topics, default_pool=pool, data_dir=tmp_path
    )

    def gateway() -> GatewayService:
        return GatewayService(
            kafka_bootstrap, database_url, topics=topics, pool=pool, port=0, decision_timeout=20
        )

    scheduler = SchedulerService(config)
    await scheduler.start()
    first_gateway = gateway()
    await first_gateway.start()
    await asyncio.to_thread(setup_queue, first_gateway.url, 4)
    await scheduler.stop()  # the scheduler is down (restarting, slow): submissions wait in Kafka
    first_gateway.decision_timeout = 1.0
    first = await _submit(first_gateway.url, tmp_path)  # in a crash, this answer is lost...
    await first_gateway.stop()  # ...with the gateway: its pending view of the token is gone
    second_gateway = gateway()
    await second_gateway.start()
    store = await PostgresEventStore.connect(database_url)
    scheduler = SchedulerService(config)
    try:
        retried = await _submit(second_gateway.url, tmp_path)  # the client's retry, same token
        assert retried == first, "the retry was answered with another job"
        await scheduler.start()
        deadline = time.monotonic() + 60
        while True:  # until the retry is decided (it follows the first submission on the partition)
            records = await store.read(pool)
            decided = [r for r in records if r.input.type == "SubmitJob"]
            if len(decided) == 2:
                break
            assert time.monotonic() < deadline, f"{len(decided)} of 2 submissions decided"
            await asyncio.sleep(0.1)  # polling interval
        accepted = [e for r in decided for e in r.events if isinstance(e, ev.JobAccepted)]
        assert len(accepted) == 1, f"one clientToken made {len(accepted)} jobs"
    finally:
        await scheduler.stop()
        await second_gateway.stop()
        await store.close()
