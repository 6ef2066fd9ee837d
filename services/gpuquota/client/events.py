"""A small asyncio client for training platforms that talk to gpuquota through Kafka (interface I4).

    async with EventsClient("kafka:9092", pool="default") as client:
        job_id = await client.submit(job_queue="jq", quota_share="research", job_name="train-1",
                                     instance_type="ml.g5.xlarge", instance_count=2)
        await client.update_priority(job_id, 50)
        async for t in client.transitions(job_id=job_id):
            print(t.status, t.event.type)
            if t.terminal:
                break

``submit``, ``update_priority`` and ``terminate`` produce ``SubmitJob`` / ``UpdateJobPriority`` /
``TerminateJob`` to ``gpuquota.scheduler.inputs`` keyed by the pool, and return once the broker has
the record; with ``wait=True`` they return once the scheduler has answered on
``gpuquota.input-results`` (``InputResult``, correlated by the input's ``event_id``), and raise
``InputRefused`` (with the reason the HTTP API would give) if it rejected the input.

``transitions(queue=..., share=..., job_id=...)`` reads ``gpuquota.job-state``: every job event with
the job's new status, in order per job. Streams start where the job-state topic ended when the client
started (``start()``), so a transition caused by anything submitted after ``start()`` is never missed;
``from_beginning=True`` replays what the topic still holds. Events are delivered at least once by the
scheduler (it republishes after a restart); the client drops repeated event ids.

A broker that wants TLS or SASL/SCRAM: pass ``security``, e.g. the services' own settings,
``EventsClient(..., security=KafkaClientSettings.from_env(os.environ).kafka_security)``
(``GPUQUOTA_KAFKA_SECURITY_PROTOCOL``, ``GPUQUOTA_KAFKA_SASL_*``, ``GPUQUOTA_KAFKA_SSL_*``; see
docs/configuration.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaConsumer, TopicPartition

from gpuquota.adapters.kafka import (
    InputProducer,
    KafkaTopics,
    bootstrap_list,
    client_options,
    header,
    partition_for,
)
from gpuquota.config.kafka import PLAINTEXT, KafkaSecurity
from gpuquota.support.ids import uuid4, uuid7
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import TERMINAL_STATUSES, JobSpec, JobStatus
from gpuquota.wire.events import EVENT_ADAPTER, SchedulerEvent
from gpuquota.wire.input_results import InputResult

_SEEN = 100_000
DEFAULT_WAIT_SECONDS = 60.0


class InputRefused(Exception):
    """The scheduler rejected an input; ``result.reason`` says why (as the HTTP API would)."""

    def __init__(self, result: InputResult) -> None:
        super().__init__(result.reason)
        self.result = result


@dataclass(frozen=True, slots=True)
class Transition:
    job_id: str
    status: JobStatus
    event: SchedulerEvent
    job_queue: str | None
    quota_share: str | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class EventsClient:
    """Submit jobs and follow their transitions over Kafka; ``async with`` starts and stops it."""

    def __init__(
        self,
        bootstrap: str,
        *,
        pool: str = "default",
        topic_prefix: str = "",
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.pool = pool
        self.topics = KafkaTopics(topic_prefix)
        self.security = security
        self._producer = InputProducer(bootstrap, self.topics, client_id="gpuquota-events", security=security)
        self._start: dict[TopicPartition, int] = {}
        self._results_start: tuple[TopicPartition, int] | None = None
        self._waiters: dict[str, asyncio.Future[InputResult]] = {}
        self._results_reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._producer.start()
        probe = self._consumer()
        await probe.start()
        try:
            partitions = await self._producer.partitions_for(self.topics.job_state)
            tps = [TopicPartition(self.topics.job_state, p) for p in partitions]
            self._start = dict(await probe.end_offsets(tps))
            # the pool's results, from before anything this client sends: no answer can be missed
            count = len(await self._producer.partitions_for(self.topics.input_results))
            results = TopicPartition(self.topics.input_results, partition_for(self.pool, count))
            self._results_start = (results, (await probe.end_offsets([results]))[results])
        finally:
            await probe.stop()

    def _consumer(self) -> AIOKafkaConsumer:
        """A consumer without a group (it assigns and seeks itself), with the client's credentials."""
        return AIOKafkaConsumer(
            bootstrap_servers=bootstrap_list(self.bootstrap),
            enable_auto_commit=False,
            **client_options(self.security),
        )

    async def stop(self) -> None:
        if self._results_reader is not None:
            self._results_reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._results_reader
        await self._producer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ----- commands ------------------------------------------------------------------------------

    async def submit(
        self,
        *,
        job_queue: str,
        quota_share: str,
        job_name: str,
        instance_type: str = "ml.g5.xlarge",
        instance_count: int = 1,
        priority: int = 0,
        payload: Mapping[str, Any] | str | None = None,
        job_id: str | None = None,
        retry_attempts: int = 1,
        attempt_duration_seconds: int | None = None,
        tags: Mapping[str, str] | None = None,
        wait: bool = False,
        timeout: float = DEFAULT_WAIT_SECONDS,
    ) -> str:
        """Submit a job (a SageMaker CreateTrainingJob ``payload``); return its id.

        ``wait``: return only once the scheduler accepted it; ``InputRefused`` if it rejected it,
        ``TimeoutError`` if it did not answer within ``timeout`` seconds.
        """
        if payload is None:
            payload = {
                "TrainingJobName": job_name,
                "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": instance_count},
            }
        now = _now_ms()
        spec = JobSpec(
            job_id=job_id or uuid4(),
            job_name=job_name,
            job_queue=job_queue,
            quota_share=quota_share,
            priority=priority,
            unit=instance_type,
            count=instance_count,
            created_at=now,
            retry_attempts=retry_attempts,
            attempt_duration_seconds=attempt_duration_seconds,
            payload=payload if isinstance(payload, str) else json.dumps(payload),
            tags=dict(tags or {}),
        )
        message = inp.SubmitJob(event_id=uuid7(now), occurred_at=now, job=spec)
        await self.send(message, wait=wait, timeout=timeout)
        return spec.job_id

    async def update_priority(
        self, job_id: str, priority: int, *, wait: bool = False, timeout: float = DEFAULT_WAIT_SECONDS
    ) -> None:
        message = inp.UpdateJobPriority(
            event_id=uuid7(), occurred_at=_now_ms(), job_id=job_id, priority=priority
        )
        await self.send(message, wait=wait, timeout=timeout)

    async def terminate(
        self,
        job_id: str,
        reason: str = "Terminated by user",
        *,
        wait: bool = False,
        timeout: float = DEFAULT_WAIT_SECONDS,
    ) -> None:
        message = inp.TerminateJob(event_id=uuid7(), occurred_at=_now_ms(), job_id=job_id, reason=reason)
        await self.send(message, wait=wait, timeout=timeout)

    async def send(
        self, message: inp.SchedulerInput, *, wait: bool = False, timeout: float = DEFAULT_WAIT_SECONDS
    ) -> InputResult | None:
        """Produce any input; with ``wait``, its accepted result (else ``InputRefused``, ``TimeoutError``)."""
        if not wait:
            await self._producer.send(self.pool, message)
            return None
        answer = self._expect(message.event_id)
        try:
            await self._producer.send(self.pool, message)
            result = await asyncio.wait_for(asyncio.shield(answer), timeout)
        finally:
            self._waiters.pop(message.event_id, None)
        if result.outcome == "REJECTED":
            raise InputRefused(result)
        return result

    def _expect(self, input_event_id: str) -> asyncio.Future[InputResult]:
        assert self._results_start is not None, "start() the client first"
        if self._results_reader is None or self._results_reader.done():
            self._results_reader = asyncio.create_task(self._read_results(*self._results_start))
        future: asyncio.Future[InputResult] = asyncio.get_running_loop().create_future()
        self._waiters[input_event_id] = future
        return future

    async def _read_results(self, partition: TopicPartition, offset: int) -> None:
        """Resolve the waiters of this client's inputs from the pool's results partition."""
        consumer = self._consumer()
        await consumer.start()
        try:
            consumer.assign([partition])
            consumer.seek(partition, offset)
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    for record in records:
                        self._answer(record.value or b"")
        finally:
            await consumer.stop()

    def _answer(self, value: bytes) -> None:
        try:
            result = InputResult.model_validate_json(value)
        except ValueError:
            return  # not a result this client knows (a newer schema): skip it
        waiter = self._waiters.get(result.input_event_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    # ----- transitions ---------------------------------------------------------------------------

    async def transitions(
        self,
        queue: str | None = None,
        share: str | None = None,
        job_id: str | None = None,
        *,
        from_beginning: bool = False,
    ) -> AsyncIterator[Transition]:
        """Job transitions matching every given filter, in order per job (never ends by itself)."""
        assert self._start, "start() the client first"
        tps = list(self._start)
        if job_id is not None:
            tps = [TopicPartition(self.topics.job_state, partition_for(job_id, len(tps)))]
        consumer = self._consumer()
        await consumer.start()
        seen: OrderedDict[str, None] = OrderedDict()
        try:
            consumer.assign(tps)
            for tp in tps:
                if from_beginning:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, self._start[tp])
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    for record in records:
                        transition = _transition(record.value or b"", record.headers)
                        if transition is None or not _matches(transition, queue, share, job_id):
                            continue
                        if transition.event.event_id in seen:
                            continue
                        seen[transition.event.event_id] = None
                        if len(seen) > _SEEN:
                            seen.popitem(last=False)
                        yield transition
        finally:
            await consumer.stop()


def _transition(value: bytes, headers: Any) -> Transition | None:
    try:
        event = EVENT_ADAPTER.validate_json(value)
    except ValueError:
        return None  # not a job event this client knows (a newer schema): skip it
    status = getattr(event, "status", None)
    if not isinstance(event, ev.JOB_STATE_EVENTS) or not isinstance(status, JobStatus):
        return None
    queue, share = header(headers, "job_queue"), header(headers, "quota_share")
    if isinstance(event, ev.JobAccepted):
        job_id, queue, share = event.job.job_id, event.job.job_queue, event.job.quota_share
    else:
        job_id = event.job_id
    return Transition(job_id, status, event, queue, share)


def _matches(t: Transition, queue: str | None, share: str | None, job_id: str | None) -> bool:
    return (
        (queue is None or t.job_queue == queue)
        and (share is None or t.quota_share == share)
        and (job_id is None or t.job_id == job_id)
    )
