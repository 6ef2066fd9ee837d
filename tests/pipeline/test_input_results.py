"""Every input gets one answer on gpuquota.input-results, on the real broker and database (issue #18):
``EventsClient`` waits for it, job-state records name their input, and a re-produced input is not
answered twice."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.kafka import KafkaTopics, header
from gpuquota.client.events import EventsClient, InputRefused
from gpuquota.scheduler.faust_app import SchedulerService
from gpuquota.wire import inputs as inp
from gpuquota.wire.input_results import InputResult
from tests.builders import Harness
from tests.pipeline.conftest import Producer, scheduler_config, unique

pytestmark = pytest.mark.integration

ANSWER_SECONDS = 60.0
"""Generous: the machine is shared and the scheduler may still be joining its group."""


@asynccontextmanager
async def scheduler(
    kafka: str, database_url: str, topics: KafkaTopics, pool: str, tmp_path: Path
) -> AsyncIterator[SchedulerService]:
    service = SchedulerService(scheduler_config(kafka, database_url, topics, pool, tmp_path))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
    assert service.failure is None, service.failure


async def test_the_events_client_waits_for_each_answer_and_job_events_name_their_input(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    reader: Callable[[str], Awaitable[Any]],
) -> None:
    setup = unique(Harness.worked_example().inputs, run_id)  # resources and nodes
    for message in setup:
        await producer.send(message)
    async with (
        scheduler(kafka_bootstrap, database_url, topics, pool, tmp_path),
        EventsClient(kafka_bootstrap, pool=pool, topic_prefix=topics.prefix) as client,
    ):
        job_id = await client.submit(
            job_queue="jq", quota_share="QS1", job_name="accepted", wait=True, timeout=ANSWER_SECONDS
        )
        await client.update_priority(job_id, 42, wait=True, timeout=ANSWER_SECONDS)
        with pytest.raises(InputRefused) as refused:
            await client.submit(
                job_queue="jq", quota_share="NOPE", job_name="refused", wait=True, timeout=ANSWER_SECONDS
            )
        assert str(refused.value) == "Quota share NOPE does not exist in job queue jq"
        assert refused.value.result.outcome == "REJECTED" and refused.value.result.input_type == "SubmitJob"

        job_state = await reader(topics.job_state)
        records = await job_state.until(
            lambda rs: any(header(r.headers, "type") == "JobDispatched" for r in rs),
            ANSWER_SECONDS,
            "the job's dispatch on job-state",
        )
        answers = await reader(topics.input_results)
        records_of_results = await answers.until(
            lambda rs: len(rs) >= len(setup) + 3, ANSWER_SECONDS, "an answer to every input"
        )
        assert all(r.key == pool.encode() for r in records_of_results)
        results = [InputResult.model_validate_json(r.value or b"") for r in records_of_results]
        assert [r.input_event_id for r in results[: len(setup)]] == [m.event_id for m in setup]
        results = results[len(setup) :]
        assert [(r.input_type, r.outcome) for r in results] == [
            ("SubmitJob", "ACCEPTED"),
            ("UpdateJobPriority", "ACCEPTED"),
            ("SubmitJob", "REJECTED"),
        ]
        causes = {header(r.headers, "input_event_id") for r in records if r.key == job_id.encode()}
        assert causes == {results[0].input_event_id}
        assert results[0].job_id == job_id and results[1].events[0].type == "JobPriorityChanged"


async def test_a_reproduced_input_is_answered_once(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    reader: Callable[[str], Awaitable[Any]],
) -> None:
    terminate = inp.TerminateJob(event_id=f"{run_id}/t", occurred_at=1, job_id="nobody")
    marker = inp.TerminateJob(event_id=f"{run_id}/marker", occurred_at=2, job_id=str(uuid.uuid4()))
    async with scheduler(kafka_bootstrap, database_url, topics, pool, tmp_path):
        await producer.send(terminate)
        await producer.send(terminate)  # a producer retrying after a timeout
        await producer.send(marker)
        answers = await reader(topics.input_results)
        records = await answers.until(
            lambda rs: any(b"/marker" in (r.value or b"") for r in rs), ANSWER_SECONDS, "the marker's answer"
        )
    results = [InputResult.model_validate_json(r.value or b"") for r in records]
    assert [r.input_event_id for r in results] == [terminate.event_id, marker.event_id]
    assert (
        results[0].outcome == "REJECTED" and results[0].reason == "Job nobody does not exist or has finished"
    )
