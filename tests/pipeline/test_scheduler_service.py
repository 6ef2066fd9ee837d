"""The faust scheduler service on the real broker and database: dead letters, redelivery, restart
recovery from snapshot + tail, and an unreachable database."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.kafka import KafkaTopics, partition_for
from gpuquota.core import fingerprint, replay
from gpuquota.scheduler import pacing as scheduler_pacing
from gpuquota.scheduler.faust_app import SchedulerService
from gpuquota.wire import events as ev
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NODE_COMMAND_ADAPTER, RunAttempt
from tests.builders import Harness, job
from tests.pipeline.conftest import PARTITIONS, Producer, TcpProxy, scheduler_config, unique, wait_until

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 10.0
"""How long the database stays unreachable in the outage test (issue #4 asks for 10 s)."""


@asynccontextmanager
async def running(service: SchedulerService) -> AsyncIterator[SchedulerService]:
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
    assert service.failure is None, service.failure


def scenario(run_id: str, jobs: int = 3) -> list[SchedulerInput]:
    h = Harness.worked_example()
    h.submit(*(job(f"j{i}").share(f"QS{i % 3 + 1}") for i in range(jobs)))
    return unique(h.inputs, run_id)


async def logged(store: EventStore, pool: str, count: int, timeout: float = 20) -> None:
    async def done() -> bool:
        return await store.last_seq(pool) >= count

    await wait_until(done, timeout, f"{count} records in the log of {pool}")


def state_of(service: SchedulerService, pool: str) -> Any:
    assert service.pipeline is not None
    return service.pipeline.runtimes[pool].state


async def test_invalid_records_are_dead_lettered_and_the_agent_continues(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    store: EventStore,
    reader: Callable[[str], Awaitable[Any]],
) -> None:
    inputs = scenario(run_id, jobs=1)
    bad = [
        b'{"type": "SubmitJob", "event_id": "x", ',
        json.dumps({"type": "LaunchRockets", "event_id": f"{run_id}/r", "occurred_at": 1}).encode(),
        json.dumps({"type": "UpdateJobPriority", "event_id": f"{run_id}/u", "occurred_at": 1}).encode(),
    ]
    service = SchedulerService(scheduler_config(kafka_bootstrap, database_url, topics, pool, tmp_path))
    async with running(service):
        offsets = [await producer.send(value) for value in bad[:2]]
        await producer.send(inputs[0])
        offsets.append(await producer.send(bad[2]))
        for message in inputs[1:]:
            await producer.send(message)
        await logged(store, pool, len(inputs))

        letters_topic = await reader(topics.dead_letter)
        records = await letters_topic.until(lambda rs: len(rs) >= 3, 20, "three dead letters")

    letters = [json.loads(r.value) for r in records]
    assert [letter["reason"].split(":")[0].split(" '")[0] for letter in letters] == [
        "malformed JSON",
        "unknown message type",
        "schema violation",
    ]
    assert [letter["offset"] for letter in letters] == offsets
    assert [letter["original"].encode() for letter in letters] == bad
    assert all(letter["topic"] == topics.inputs for letter in letters)
    assert [r.key for r in records] == [pool.encode()] * 3
    assert [r.input.event_id for r in await store.read(pool)] == [m.event_id for m in inputs]


async def test_redelivered_and_reproduced_inputs_are_not_applied_twice(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    store: EventStore,
) -> None:
    inputs = scenario(run_id)
    config = scheduler_config(kafka_bootstrap, database_url, topics, pool, tmp_path)
    first = SchedulerService(config)
    async with running(first):
        for message in inputs:
            await producer.send(message)
        await producer.send(inputs[-1])  # produced twice (a client retried)
        await logged(store, pool, len(inputs))
        assert first.pipeline is not None
        pipeline = first.pipeline
        await wait_until(lambda: pipeline.stats.duplicates == 1, 10, "the duplicate")
        live = fingerprint(state_of(first, pool))
    before = await store.read(pool)

    # a new consumer group: Kafka redelivers every record; the recorded positions skip them
    second = SchedulerService(dataclasses.replace(config, app_id=f"{run_id}-other-group"))
    async with running(second):
        assert second.pipeline is not None
        again = second.pipeline
        await wait_until(
            lambda: again.stats.skipped + again.stats.duplicates == len(inputs) + 1, 20, "redelivery"
        )
        assert again.stats.decided == 0
        assert fingerprint(state_of(second, pool)) == live
    assert await store.read(pool) == before
    assert len(before) == len(inputs)


async def test_restart_recovers_from_snapshot_and_tail(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    store: EventStore,
    reader: Callable[[str], Awaitable[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Snapshot pacing (a dump that took long defers the next one) would make the snapshot positions
    # depend on the machine's load; this test is about recovery from a snapshot at a known position.
    monkeypatch.setattr(scheduler_pacing, "_CHEAP_DUMP_SECONDS", 3600.0)
    inputs = scenario(run_id, jobs=4)  # 11 inputs: snapshots at 4 and 8, a tail of 3
    config = scheduler_config(kafka_bootstrap, database_url, topics, pool, tmp_path, snapshot_every=4)
    first = SchedulerService(config)
    async with running(first):
        for message in inputs:
            await producer.send(message)
        await logged(store, pool, len(inputs))
        assert first.pipeline is not None
        await first.pipeline.flush()
        live = fingerprint(state_of(first, pool))
    snapshot = await store.latest_snapshot(pool)
    assert snapshot is not None and snapshot.seq == 8

    second = SchedulerService(config)
    async with running(second):
        assert second.pipeline is not None
        recovered = second.pipeline
        await wait_until(lambda: pool in recovered.runtimes, 20, "the pool to be loaded on assignment")
        assert fingerprint(state_of(second, pool)) == live
        events = [e for r in await store.read(pool) for e in r.events]
        assert fingerprint(replay(events)) == live
        assert recovered.stats.republished > 0  # the tail's job events and RunAttempts

        extra = unique(Harness().submit(job("late").share("QS1")).inputs, f"{run_id}-late")
        await producer.send(extra[0])
        await logged(store, pool, len(inputs) + 1)
        (record,) = await store.read(pool, after_seq=len(inputs))
        assert isinstance(record.events[0], ev.JobAccepted)

    commands = await reader(topics.node_commands)
    records = await commands.until(bool, 10, "node commands")
    runs = [NODE_COMMAND_ADAPTER.validate_json(r.value) for r in records]
    assert all(isinstance(c, RunAttempt) for c in runs)


async def test_no_decisions_while_the_database_is_unreachable_then_resume(
    kafka_bootstrap: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    store: EventStore,
    pg_proxy: tuple[TcpProxy, str],
) -> None:
    proxy, proxied_url = pg_proxy
    inputs = scenario(run_id, jobs=4)
    half = len(inputs) // 2
    config = scheduler_config(kafka_bootstrap, proxied_url, topics, pool, tmp_path, store_retry_seconds=60)
    service = SchedulerService(config)
    async with running(service):
        assert service.pipeline is not None
        pipeline = service.pipeline
        for message in inputs[:half]:
            await producer.send(message)
        await logged(store, pool, half)

        await proxy.stop()  # PostgreSQL is unreachable from the scheduler now
        cut_at = time.monotonic()
        for message in inputs[half:]:
            await producer.send(message)
        await wait_until(lambda: pipeline.stats.transient_errors >= 3, 20, "failed appends being retried")
        # The fault lasts OUTAGE_SECONDS (issue #4: the database away for 10 s), however soon the
        # retries started: this sleep is the length of the outage, not a synchronisation.
        await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - cut_at)))
        assert not pipeline.store_available
        assert await store.last_seq(pool) == half  # nothing decided without a durable log
        assert pipeline.stats.decided == half

        await proxy.start()  # same port again
        await logged(store, pool, len(inputs))
        assert pipeline.store_available

    records = await store.read(pool)
    assert [r.input.event_id for r in records] == [m.event_id for m in inputs]
    assert fingerprint(replay(e for r in records for e in r.events)) == fingerprint(state_of_replayed(inputs))


def state_of_replayed(inputs: list[SchedulerInput]) -> Any:
    """The state the core reaches by deciding ``inputs`` in order (the reference)."""
    from gpuquota.core import ClusterState, decide, evolve

    state = ClusterState()
    for message in inputs:
        for event in decide(state, message):
            evolve(state, event)
    return state


async def test_a_database_outage_beyond_the_retry_bound_leaves_the_service_unready_not_dead(
    kafka_bootstrap: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    store: EventStore,
    pg_proxy: tuple[TcpProxy, str],
) -> None:
    """Issue #30: past ``store_retry_seconds`` the scheduler says so and retries on (its readiness
    fails, its process stays); the input waits on Kafka and is decided once the database is back."""
    proxy, proxied_url = pg_proxy
    inputs = scenario(run_id, jobs=1)
    config = scheduler_config(kafka_bootstrap, proxied_url, topics, pool, tmp_path, store_retry_seconds=1)
    service = SchedulerService(config)
    async with running(service):
        assert service.pipeline is not None
        pipeline = service.pipeline
        await producer.send(inputs[0])
        await logged(store, pool, 1)
        await proxy.stop()
        await producer.send(inputs[1])
        errors = pipeline.stats.transient_errors
        # well past the bound: retries at the longest back-off (2 s) go on, the service does not fail
        await wait_until(lambda: pipeline.stats.transient_errors >= errors + 4, 30, "retries past the bound")
        assert service.failure is None and not pipeline.store_available
        assert await store.last_seq(pool) == 1

        await proxy.start()
        await logged(store, pool, 2)
        assert pipeline.store_available and service.failure is None


def pools_on_distinct_partitions(run_id: str) -> list[str]:
    found: dict[int, str] = {}
    for index in range(100):
        name = f"p-{run_id}-{index}"
        found.setdefault(partition_for(name, PARTITIONS), name)
        if len(found) == PARTITIONS:
            return [found[p] for p in sorted(found)]
    raise AssertionError("no pool names for every partition")


def inputs_held(service: SchedulerService, topic: str) -> set[int]:
    assert service.app is not None
    return {tp.partition for tp in service.app.consumer.assignment() if tp.topic == topic}


async def test_partitions_move_between_two_schedulers_without_loss_or_duplicates(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    store: EventStore,
) -> None:
    pools = pools_on_distinct_partitions(run_id)
    sent: dict[str, list[SchedulerInput]] = {pool: [] for pool in pools}

    async def feed(jobs: range) -> None:
        for pool in pools:
            h = Harness.worked_example() if not sent[pool] else Harness()
            h.submit(*(job(f"j{i}").share(f"QS{i % 3 + 1}") for i in jobs))
            for message in unique(h.inputs, f"{run_id}/{pool}/{jobs.start}"):
                await producer.send(message, key=pool.encode())
                sent[pool].append(message)
        for pool in pools:
            await logged(store, pool, len(sent[pool]), timeout=60)

    def config(name: str) -> Any:
        return scheduler_config(kafka_bootstrap, database_url, topics, pools[0], tmp_path / name)

    first, second = SchedulerService(config("a")), SchedulerService(config("b"))
    await first.start()
    try:
        await feed(range(0, 3))
        await second.start()
        try:
            await wait_until(
                lambda: len(inputs_held(first, topics.inputs))
                == len(inputs_held(second, topics.inputs))
                == 1,
                60,
                "the partitions to be split between the two schedulers",
            )
            await feed(range(3, 6))
        finally:
            await first.stop()
        await wait_until(lambda: len(inputs_held(second, topics.inputs)) == PARTITIONS, 60, "a takeover")
        await feed(range(6, 9))
        assert second.pipeline is not None
        for pool in pools:
            records = await store.read(pool)
            assert [r.input.event_id for r in records] == [m.event_id for m in sent[pool]]
            state = (await second.pipeline.runtime(pool)).state
            assert fingerprint(state) == fingerprint(replay(e for r in records for e in r.events))
    finally:
        await second.stop()
    assert first.failure is None and second.failure is None
