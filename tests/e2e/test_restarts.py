"""Crash and restart of ``gpuquota up`` (issue #11): nothing lost, nothing stuck, nothing run twice.

``gpuquota up`` runs as an OS process with real job processes (``tests/e2e/faults.py``). The checks
after each test are those of ``faults.check``. Every test prints one ``FAULT`` line with its figures
(docs/benchmarks.md). The job count of the kill -9 test is ``GPUQUOTA_FAULT_JOBS`` (default 400: the
2,000 of the issue take several minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.kafka import KafkaTopics, ensure_topics
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.adapters.sqlite_store import STORE_FILE, SqliteEventStore
from gpuquota.entrypoints.embedded import EmbeddedStack
from tests.e2e.faults import Client, Figures, Up, check, kill_leftovers, settle, setup_queue, statuses

pytestmark = pytest.mark.slow

JOBS = int(os.environ.get("GPUQUOTA_FAULT_JOBS", "400"))
SLOTS = 4


@pytest_asyncio.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    made = Up(tmp_path, f"ml.g5.xlarge={SLOTS}")
    try:
        yield made
    finally:
        if made.process is not None and made.process.alive:
            await made.stop()
        kill_leftovers(tmp_path)


@pytest_asyncio.fixture(params=["embedded", pytest.param("distributed", marks=pytest.mark.integration)])
async def any_up(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Up]:
    """``gpuquota up`` in either mode (distributed: the real Kafka and PostgreSQL, a fresh pool)."""
    extra: list[str] = []
    env: dict[str, str] = {}
    if request.param == "distributed":
        kafka = request.getfixturevalue("kafka_bootstrap")
        database_url = request.getfixturevalue("database_url")
        run = uuid.uuid4().hex[:10]
        topics = KafkaTopics(f"f{run}.")
        await ensure_topics(kafka, topics, partitions=2)
        extra = ["--kafka", kafka, "--database-url", database_url]
        env = {"GPUQUOTA_TOPIC_PREFIX": topics.prefix, "GPUQUOTA_POOL": f"p-{run}"}
    made = Up(tmp_path, f"ml.g5.xlarge={SLOTS}", extra, env)
    try:
        yield made
    finally:
        if made.process is not None and made.process.alive:
            await made.stop()
        kill_leftovers(tmp_path)


async def checked(up: Up, acknowledged: dict[str, str]) -> Figures:
    """Stops the stack (SIGTERM) and checks its log."""
    assert await up.stop() == 0
    if "--database-url" in up.extra:
        database_url = up.extra[up.extra.index("--database-url") + 1]
        store: EventStore = await PostgresEventStore.connect(database_url)
        pool = up.env["GPUQUOTA_POOL"]
    else:
        store, pool = await SqliteEventStore.open(up.root / "data" / STORE_FILE), "default"
    try:
        return await check(store, pool, up.root, acknowledged)
    finally:
        await store.close()


async def test_kill_9_of_gpuquota_up_during_many_short_jobs(any_up: Up) -> None:
    up = any_up
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed {seed}")
    await up.start()
    await asyncio.to_thread(setup_queue, up.url, SLOTS)
    client = Client(lambda: up.url, up.root, JOBS, ticks=[0, 1, 2, 4])
    client.start()
    figures = Figures()
    for _ in range(3):
        await asyncio.sleep(rng.uniform(1.0, 6.0))  # a random point of the run
        await up.kill()
        killed = time.monotonic()
        await up.start()
        figures.recovery_seconds.append(time.monotonic() - killed)
    await client.wait(timeout=300)
    await settle(up.url, list(client.acknowledged.values()), 180, up.logs)
    found = await checked(up, client.acknowledged)
    found.recovery_seconds = figures.recovery_seconds
    mode = "distributed" if up.extra else "embedded"
    print(found.line(f"kill -9 of gpuquota up ({mode})"))


async def test_the_client_waits_for_the_restarted_stack_not_a_process_on_its_old_port(up: Up) -> None:
    """With ``--port 0`` the port of a killed ``gpuquota up`` is free until it is back on a new one;
    any process may bind it meanwhile, e.g. another test's fresh gateway (here: one with no job
    queue). The fault client must wait for the new address, not take that gateway's refusal ("Job
    queue jq does not exist") for our stack's: a one-off failure of the distributed kill -9 test."""
    await up.start()
    await asyncio.to_thread(setup_queue, up.url, SLOTS)
    old_port = int(up.url.rsplit(":", 1)[1])
    await up.kill()
    squatter = EmbeddedStack(None, "127.0.0.1", old_port, nodes="", runtime="simulated", tick_seconds=0)
    await squatter.start()
    asked: list[str] = []

    def url() -> str:
        asked.append(up.url)
        return up.url

    client = Client(url, up.root, 4, ticks=[0])
    try:
        client.start()
        deadline = time.monotonic() + 30
        while len(asked) < 3 and not client.done.is_set():  # it tried while the stack was down
            assert time.monotonic() < deadline, "the client did not ask for the stack's address"
            await asyncio.sleep(0.05)  # polling interval
        await up.start()
        await client.wait(timeout=120)
    finally:
        await squatter.stop()
    await settle(up.url, list(client.acknowledged.values()), 60, up.logs)
    await checked(up, client.acknowledged)


async def test_sigterm_restarts_keep_running_jobs(up: Up) -> None:
    """A clean restart with ``--leave-running`` adopts the running jobs: they end SUCCEEDED by their
    real exit code, once (without it, a stop stops them: tests/cli/test_up_stop.py)."""
    up.extra.append("--leave-running")
    await up.start()
    await asyncio.to_thread(setup_queue, up.url, SLOTS)
    client = Client(
        lambda: up.url, up.root, 24, ticks=[20, 30]
    )  # 1 to 1.5 s each: running across the restarts
    client.start()
    figures = Figures()
    await client.wait(timeout=120)
    for _ in range(3):
        await asyncio.sleep(1.0)
        assert await up.stop() == 0
        stopped = time.monotonic()
        await up.start()
        figures.recovery_seconds.append(time.monotonic() - stopped)
    jobs = list(client.acknowledged.values())
    await settle(up.url, jobs, 180, up.logs)
    found = await checked(up, client.acknowledged)
    found.recovery_seconds = figures.recovery_seconds
    assert found.requeued == 0, "a clean restart requeued running jobs instead of adopting them"
    print(found.line("SIGTERM restarts of gpuquota up"))


async def test_a_node_back_with_fewer_slots_keeps_the_attempts_that_fit(up: Up) -> None:
    await up.start()
    await asyncio.to_thread(setup_queue, up.url, SLOTS)
    client = Client(lambda: up.url, up.root, SLOTS, ticks=[100_000])  # they run until released
    client.start()
    await client.wait(timeout=60)
    jobs = list(client.acknowledged.values())

    async def all_running() -> bool:
        found = await asyncio.to_thread(statuses, up.url, jobs)
        return all(s == "RUNNING" for s in found.values())

    deadline = time.monotonic() + 60
    while not await all_running():
        assert time.monotonic() < deadline, up.logs()
        await asyncio.sleep(0.2)  # polling interval
    await up.kill()
    killed = time.monotonic()
    await up.start(nodes="ml.g5.xlarge=2")  # the node comes back with two slots fewer
    recovery = time.monotonic() - killed
    deadline = time.monotonic() + 60
    while True:  # two keep running (adopted), two are requeued and wait for a slot
        found = await asyncio.to_thread(statuses, up.url, jobs)
        if sorted(found.values()) == ["RUNNABLE", "RUNNABLE", "RUNNING", "RUNNING"]:
            break
        assert time.monotonic() < deadline, f"{found}\n{up.logs()}"
        await asyncio.sleep(0.2)  # polling interval
    (up.root / "release").write_text("now")
    await settle(up.url, jobs, 120, up.logs)
    found_figures = await checked(up, client.acknowledged)
    found_figures.recovery_seconds = [recovery]
    print(found_figures.line("re-registration with fewer slots"))


async def test_a_second_stack_on_the_same_data_dir_exits_at_once(up: Up) -> None:
    await up.start()
    assert up.process is not None and up.process.proc is not None
    second = up.make()
    began = time.monotonic()
    with pytest.raises(AssertionError, match="exited early"):
        await second.start(timeout=60)
    assert second.proc is not None
    assert await second.proc.wait() != 0
    assert f"is in use by pid {up.process.proc.pid}" in second.tail()
    assert time.monotonic() - began < 30
    assert up.process.alive
    await asyncio.to_thread(setup_queue, up.url, SLOTS)  # the first one still works
