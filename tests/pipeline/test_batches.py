"""The scheduler service takes its inputs in batches: a burst is appended in few transactions, decided
exactly as one at a time, acked (offsets committed) only once handled, and the consumer's fetches do
not park for faust's 1.5 s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuquota.adapters.event_store import BatchEntry, EventStore
from gpuquota.adapters.kafka import KafkaTopics, encode, message_headers, partition_for
from gpuquota.core import fingerprint, replay
from gpuquota.scheduler.faust_app import SchedulerService
from gpuquota.wire.inputs import SchedulerInput
from tests.builders import Harness, job
from tests.pipeline.conftest import PARTITIONS, scheduler_config, unique, wait_until

pytestmark = pytest.mark.integration


class CountingStore:
    """A store that counts ``append`` and ``append_many`` calls (and passes everything on)."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.singles = 0
        self.batches: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(self, *args: Any, **kwargs: Any) -> int:
        self.singles += 1
        return await self._store.append(*args, **kwargs)

    async def append_many(self, pool: str, expected_seq: int, entries: list[BatchEntry]) -> int:
        self.batches.append(len(entries))
        return await self._store.append_many(pool, expected_seq, entries)

    async def close(self) -> None:
        pass  # the test's store fixture closes the real one


def burst(run_id: str, jobs: int) -> list[SchedulerInput]:
    h = Harness.worked_example()
    h.submit(*(job(f"j{i}").share(f"QS{i % 3 + 1}") for i in range(jobs)))
    return unique(h.inputs, run_id)


async def test_a_burst_is_appended_in_batches_and_committed_once_handled(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    store: EventStore,
) -> None:
    inputs = burst(run_id, 300)
    # produced before the scheduler starts: it finds them all there at once
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        for message in inputs:
            value, headers = encode(message), message_headers(message)
            await producer.send(topics.inputs, value, key=pool.encode(), headers=headers)
        await producer.flush()
    finally:
        await producer.stop()
    counting = CountingStore(store)
    config = scheduler_config(kafka_bootstrap, database_url, topics, pool, tmp_path, commit_interval=0.1)
    service = SchedulerService(config, store=counting)  # type: ignore[arg-type]
    await service.start()
    try:
        assert service.app is not None
        consumer: Any = service.app.consumer
        fetcher = consumer._thread._consumer._fetcher  # faust hard-codes 1500 ms
        assert fetcher._fetch_max_wait_ms == 20

        async def all_logged() -> bool:
            return await store.last_seq(pool) >= len(inputs)

        await wait_until(all_logged, 60, "every input in the log")
        assert service.pipeline is not None
        live = fingerprint(service.pipeline.runtimes[pool].state)
        tp = TopicPartition(topics.inputs, partition_for(pool, PARTITIONS))
        group = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=topics.scheduler_group)
        await group.start()
        try:

            async def committed() -> bool:
                return (await group.committed(tp) or 0) >= len(inputs)

            await wait_until(committed, 20, "the offsets of the handled records to be committed")
        finally:
            await group.stop()
    finally:
        await service.stop()
    assert service.failure is None, service.failure

    assert sum(counting.batches) + counting.singles == len(inputs)
    assert len(counting.batches) + counting.singles < len(inputs) // 10  # group commit
    records = await store.read(pool)
    assert [r.input.event_id for r in records] == [m.event_id for m in inputs]
    assert fingerprint(replay(e for r in records for e in r.events)) == live
