"""The pipeline benchmark's load generator: submissions, the node player, the job-state observer.

It runs on the machine it measures, so what it spends is taken from the broker, PostgreSQL and the
scheduler; it does the benchmark's work at the least CPU it can (session 6: 0.29 ms per job before):

* Submissions go out in ticks (``TICK_SECONDS``): every record due since the last tick, from a
  template (``pipeline_workload.submission_json``), in one record batch for the pool's partition of
  the inputs topic (``send_batch``: aiokafka's ``send`` costs tens of microseconds per record, and a
  request per few records costs the broker too). A job's submission time is taken just before its
  batch is handed to the producer, as before; pacing by ticks only groups what is due.
* The node player and the observer read whatever a fetch brought (``getmany``), tell a record's kind
  from its ``type`` header (``adapters.kafka.message_headers``; the value's ``type`` when there is no
  header) and parse only the records they need, with ``json.loads``. The node player answers a
  fetch's ``RunAttempt``s in one record batch; the observer takes one clock reading per fetch (the
  moment its records were read back).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import ConsumerRecord

from benchmarks.pipeline_workload import job_id, report_json, submission_json
from gpuquota.adapters.kafka import KafkaTopics, partition_for
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.errors import TooManyRequests

Record: TypeAlias = ConsumerRecord[bytes, bytes]

TICK_SECONDS = 0.010
"""Submissions due are sent every 10 ms: 20 records a batch at 2,000/s. A produce request costs this
process more than its records (aiokafka's request, response and futures), so fewer ticks cost less.
The scheduler does not see the difference: it waits up to 20 ms for 64 KiB of inputs
(``SchedulerConfig``), longer than a tick at these rates."""
BATCH_BYTES = 1024 * 1024
"""A producer's record batch: room for every record due after a pause (the broker takes up to 1 MiB)."""
FETCH_WAIT_MS = 20
"""The benchmark's consumers read every partition; with aiokafka's default (500 ms) a fetch that leaves
out the partitions whose records are being read parks on the idle ones, and every answer to a
``RunAttempt`` (so every slot's next dispatch: 256 slots at 1,000 jobs/s must turn over within 256 ms)
and every observed dispatch waited up to that long. A node agent reads only its own partition."""
FETCH_MIN_BYTES = 16 * 1024
"""A fetch waits (at most ``FETCH_WAIT_MS``) for this much: fewer fetches, less CPU for this process.
The node player's fetch is on every slot's way back to the pool (a node agent's consumer answers at
once: aiokafka's default, 1 byte): with 64 KiB, at 3,000 jobs/s it waited about 10-20 ms per fetch
for the ``RunAttempt`` and job-state records to add up, of the 85 ms a slot of the 256 may take to
turn over, and the pool ran out; 16 KiB gave 2,976-2,998 jobs/s in four runs where 64 KiB gave
2,361-2,883 beside them (alternating runs; their tables are in the git history of
docs/benchmarks.md)."""
EVENT_ID_FIRST = '{"event_id":"'
"""How ``encode`` starts a message: its event id first (the string from the last character on)."""
_DECODER = json.JSONDecoder()
POLL_MS = 1000
"""How long ``getmany`` waits when nothing comes (it returns as soon as a fetch brings records)."""


class Watch:
    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.scheduled: dict[str, float] = {}
        self.published: dict[str, float] = {}
        """When the scheduler produced the job's first ``JobDispatched`` (the record's timestamp)."""
        self.ended: dict[str, float] = {}
        """When the scheduler produced the job's ``JobSucceeded`` (the record's timestamp)."""
        self.dispatch_ids: dict[str, str] = {}
        """The event id of each job's first ``JobDispatched``."""
        self.more_dispatch_ids: dict[str, set[str]] = {}
        """Other event ids of ``JobDispatched`` for a job (a set only for a job dispatched twice)."""
        self.first_submit = 0.0
        self.last_scheduled = 0.0
        self.inputs_sent = 0
        """Inputs produced: setup, submissions and the node player's reports."""
        self.inputs_decided = 0
        """The scheduler's recorded position in the pool's partition of the inputs topic."""
        self.admission: Admission | None = None
        """The gateway's admission control, played by the submitter (``--max-backlog``): a submission
        counts in the backlog from its produce to its ``JobAccepted`` read back; one refused is not sent."""

    def restart(self) -> None:
        """Forget the jobs watched so far (the warm-up's): what follows is measured alone."""
        for jobs in (self.submitted, self.scheduled, self.published, self.ended, self.dispatch_ids):
            jobs.clear()
        self.more_dispatch_ids.clear()
        self.first_submit = self.last_scheduled = 0.0

    def dispatched(self, job: str, event_id: str, read_at: float, published_at: float) -> None:
        if job not in self.submitted:
            return  # a warm-up job's, read after the warm-up
        first = self.dispatch_ids.setdefault(job, event_id)
        if first != event_id:
            self.more_dispatch_ids.setdefault(job, set()).add(event_id)
        if job not in self.scheduled:
            self.scheduled[job] = self.last_scheduled = read_at
            self.published[job] = published_at

    def succeeded(self, job: str, published_at: float) -> None:
        if job in self.published:
            self.ended.setdefault(job, published_at)

    def duplicate_dispatches(self) -> int:
        """``JobDispatched`` events (distinct event ids) beyond the first per job."""
        return sum(len(ids) for ids in self.more_dispatch_ids.values())


def record_type(record: Record) -> bytes | None:
    """The ``type`` header's value (the message's kind), None without one."""
    for name, value in record.headers:
        if name == "type":
            kind: bytes = value
            return kind
    return None


def message_of_type(record: Record, kind: bytes) -> dict[str, Any] | None:
    """The record's message as JSON if it is a ``kind``, else None (not parsed when a header says so)."""
    header = record_type(record)
    if header is not None and header != kind:
        return None
    message = json.loads(record.value or b"{}")
    return message if isinstance(message, dict) and message.get("type") == kind.decode() else None


def dispatch_of(record: Record) -> tuple[str, str] | None:
    """(job id, event id) of a ``JobDispatched`` record of ``gpuquota.job-state``, else None. The job id
    is the record's key (the topic's key); the event id, the message's first field, is decoded alone
    when the value starts with it (as ``encode`` writes it), the whole value otherwise."""
    kind = record_type(record)
    if kind is None or record.key is None:
        message = message_of_type(record, b"JobDispatched")
        return None if message is None else (message["job_id"], message["event_id"])
    if kind != b"JobDispatched":
        return None
    value = (record.value or b"").decode()
    first = None
    if value.startswith(EVENT_ID_FIRST):
        first = _DECODER.raw_decode(value, len(EVENT_ID_FIRST) - 1)[0]
    event_id: str = first if isinstance(first, str) else json.loads(value)["event_id"]
    return record.key.decode(), event_id


async def started_consumer(kafka: str, *topics: str) -> AIOKafkaConsumer:
    """A consumer of ``topics`` from their start that fetches as soon as there is something to read."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=kafka,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_WAIT_MS,
        fetch_min_bytes=FETCH_MIN_BYTES,
    )
    await consumer.start()
    return consumer


async def started_producer(kafka: str) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True, max_batch_size=BATCH_BYTES)
    await producer.start()
    return producer


class PoolSender:
    """Record batches for the pool's partition of the inputs topic (key = pool, the default
    partitioner's partition), through one producer."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, pool: str, partitions: int) -> None:
        self._producer, self._topic = producer, topic
        self._key = pool.encode()
        self._partition = partition_for(pool, partitions)
        self._batch: BatchBuilder = producer.create_batch()

    @classmethod
    async def of(cls, producer: AIOKafkaProducer, topic: str, pool: str) -> PoolSender:
        return cls(producer, topic, pool, len(await producer.partitions_for(topic)))

    async def add(self, value: bytes) -> None:
        if self._batch.append(key=self._key, value=value, timestamp=None) is None:  # full
            await self.send()
            self._batch.append(key=self._key, value=value, timestamp=None)

    async def send(self) -> None:
        """Hands the records added so far to the producer (closed: no linger)."""
        if self._batch.record_count():
            batch, self._batch = self._batch, self._producer.create_batch()
            batch.close()
            await self._producer.send_batch(batch, self._topic, partition=self._partition)


async def submit(sender: PoolSender, run: str, rate: float, total: int, watch: Watch) -> None:
    """Submits jobs 0 .. ``total - 1`` of ``run``, job ``i`` due ``i / rate`` seconds after the first."""
    start = time.monotonic()
    watch.first_submit = time.time()
    sent = 0
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            at = time.time()  # just before the records are handed to the producer
            at_ms = int(at * 1000)
            admitted = 0
            for index in range(sent, due):
                job = job_id(run, index)
                if watch.admission is not None:
                    try:
                        watch.admission.check()
                    except TooManyRequests:  # refused (a client would back off and retry): not sent
                        refuse_rest(watch.admission, due - index - 1)
                        break
                    watch.admission.handed(job)
                await sender.add(submission_json(run, index, at_ms))
                watch.submitted[job] = at
                admitted += 1
            await sender.send()
            watch.inputs_sent += admitted
            sent = due
        next_due = start + sent / rate
        await asyncio.sleep(max(TICK_SECONDS, next_due - time.monotonic()))  # pacing the submission rate


def refuse_rest(admission: Admission, count: int) -> None:
    """The tick's submissions after its first refusal are refused too (nothing is decided before the
    tick ends): counted without being asked one by one, so that an overload costs this process nothing
    per refused submission and the load it offers does not take CPU from what it measures."""
    admission.refused += count


async def play_nodes_and_observe(kafka: str, topics: KafkaTopics, pool: str, watch: Watch) -> None:
    """Plays every node agent and watches ``gpuquota.job-state``, on one consumer of both topics (one
    fetch for both: every fetch request and its answer cost this process CPU).

    The node player answers each ``RunAttempt`` at once with SUCCEEDED, through a producer of its own,
    as a node agent has: sharing the submissions' producer, a report waited behind their batches (up to
    15 s on a loaded machine) and no command was read meanwhile. The observer records each job's
    ``JobDispatched`` events and when the first was read back."""
    consumer = await started_consumer(kafka, topics.node_commands, topics.job_state)
    producer = await started_producer(kafka)
    try:
        sender = await PoolSender.of(producer, topics.inputs, pool)
        while True:
            fetched = await consumer.getmany(timeout_ms=POLL_MS)
            read_at = time.time()
            for partition, records in fetched.items():
                if partition.topic == topics.node_commands:
                    await _answer(records, sender, int(read_at * 1000), watch)
                else:
                    _observe(records, read_at, watch)
            await sender.send()
    finally:
        await consumer.stop()
        await producer.stop()


async def _answer(records: list[Record], sender: PoolSender, at: int, watch: Watch) -> None:
    for record in records:
        if attempt := message_of_type(record, b"RunAttempt"):
            await sender.add(report_json(attempt["attempt_id"], attempt["node_id"], attempt["job_id"], at))
            watch.inputs_sent += 1


def _observe(records: list[Record], read_at: float, watch: Watch) -> None:
    for record in records:
        if watch.admission is not None and record.key is not None and record_type(record) == b"JobAccepted":
            watch.admission.decided(record.key.decode())
        elif ids := dispatch_of(record):
            watch.dispatched(*ids, read_at, record.timestamp / 1000)
        elif record.key is not None and record_type(record) == b"JobSucceeded":
            watch.succeeded(record.key.decode(), record.timestamp / 1000)
