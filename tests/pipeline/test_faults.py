"""Heavy fault tests of the distributed mode (marked ``slow``): the scheduler process killed with
SIGKILL five times while 5,000 jobs run, and a broker restart under load.

The test plays the node agents (``FakeNodes``): every new attempt is answered once with an
``AttemptReport`` SUCCEEDED, as an agent would after running it; a repeated ``RunAttempt`` (the
scheduler republishes after a restart) is ignored, as the real agent does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from benchmarks.pipeline import NullPublisher, setup_inputs, submission
from gpuquota.adapters.event_store import EventStore, Record
from gpuquota.adapters.kafka import KafkaTopics, encode, ensure_topics
from gpuquota.core import fingerprint, replay
from gpuquota.scheduler.faust_app import SchedulerService
from gpuquota.scheduler.pipeline import Pipeline
from gpuquota.wire import inputs as inp
from gpuquota.wire.node_commands import NODE_COMMAND_ADAPTER, RunAttempt
from tests.conftest import LocalService
from tests.pipeline.conftest import PARTITIONS, scheduler_config, wait_until
from tests.pipeline.recorded_schemas import assert_every_input_answered
from tests.pipeline.services import ServiceProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class FakeNodes:
    """Answers each new RunAttempt with SUCCEEDED; retries its sends through broker outages."""

    def __init__(self, bootstrap: str, topics: KafkaTopics, pool: str) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.pool = pool
        self.attempts: dict[str, set[str]] = {}
        self.run_attempts = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, linger_ms=2)
        consumer = AIOKafkaConsumer(
            self.topics.node_commands, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest"
        )
        await producer.start()
        await consumer.start()
        try:
            async for record in consumer:
                command = NODE_COMMAND_ADAPTER.validate_json(record.value or b"")
                if not isinstance(command, RunAttempt):
                    continue
                self.run_attempts += 1
                seen = self.attempts.setdefault(command.job_id, set())
                if command.attempt_id in seen:
                    continue
                seen.add(command.attempt_id)
                report = inp.AttemptReport(
                    event_id=f"{command.attempt_id}/done",
                    occurred_at=time.time_ns() // 1_000_000,
                    node_id=command.node_id,
                    job_id=command.job_id,
                    attempt_id=command.attempt_id,
                    status="SUCCEEDED",
                    exit_code=0,
                )
                await send_retrying(producer, self.topics.inputs, encode(report), self.pool.encode())
        finally:
            await consumer.stop()
            await producer.stop()


async def send_retrying(producer: AIOKafkaProducer, topic: str, value: bytes, key: bytes) -> None:
    while True:
        try:
            await producer.send_and_wait(topic, value, key=key)
            return
        except KafkaError:
            await asyncio.sleep(0.5)  # the broker is away; back off, then produce again


async def event_counts(database_url: str, pool: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT event_type, count(*) FROM events WHERE pool = $1 GROUP BY 1", pool)
    finally:
        await conn.close()
    return {row[0]: row[1] for row in rows}


async def assert_recovery_matches_replay(store: EventStore, pool: str) -> None:
    """Loading the pool from its latest snapshot plus the tail equals folding the whole log."""
    records: list[Record] = []
    while batch := await store.read(pool, after_seq=len(records)):
        records.extend(batch)
    loaded = await Pipeline(store, NullPublisher()).runtime(pool)
    assert loaded.seq == len(records)
    assert fingerprint(loaded.state) == fingerprint(replay(e for r in records for e in r.events))


async def test_scheduler_killed_five_times_during_5000_jobs(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    store: EventStore,
) -> None:
    jobs, kills = 5000, 5
    setup = setup_inputs(run_id)
    expected_inputs = len(setup) + 2 * jobs  # submissions and one report each
    env = {
        "GPUQUOTA_KAFKA": kafka_bootstrap,
        "GPUQUOTA_DATABASE_URL": database_url,
        "GPUQUOTA_TOPIC_PREFIX": topics.prefix,
        "GPUQUOTA_POOL": pool,
        "GPUQUOTA_DATA_DIR": str(tmp_path / "scheduler"),
        "GPUQUOTA_SNAPSHOT_EVERY": "500",
        "GPUQUOTA_HEARTBEAT_SECONDS": "600",  # the fake nodes send no heartbeats
        "GPUQUOTA_INSTANCE_ID": f"scheduler-{run_id}",
    }
    log = tmp_path / "scheduler.log"
    nodes = FakeNodes(kafka_bootstrap, topics, pool)
    await nodes.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    scheduler = ServiceProcess("scheduler", env, log)
    try:
        await scheduler.start()
        for message in setup:
            await producer.send_and_wait(topics.inputs, encode(message), key=pool.encode())

        async def submit_all() -> None:
            started = time.monotonic()
            for index in range(jobs):
                delay = started + index / 250 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # 250 submissions per second
                await producer.send(topics.inputs, encode(submission(run_id, index)), key=pool.encode())
            await producer.flush()

        submitting = asyncio.create_task(submit_all())
        for k in range(1, kills + 1):
            threshold = expected_inputs * k // (kills + 1)

            async def progressed(at: int = threshold, running: ServiceProcess = scheduler) -> bool:
                assert running.alive, running.tail()
                return await store.last_seq(pool) >= at

            await wait_until(progressed, 120, f"{threshold} inputs decided", interval=0.02)
            await scheduler.kill()  # SIGKILL: no flush, no commit, no goodbye
            scheduler = ServiceProcess("scheduler", env, log)
            await scheduler.start()
        await submitting

        async def all_succeeded() -> bool:
            assert scheduler.alive, scheduler.tail()
            return (await event_counts(database_url, pool)).get("JobSucceeded", 0) >= jobs

        await wait_until(all_succeeded, 240, f"{jobs} jobs to succeed", interval=0.5)
        assert await scheduler.stop() == 0
    except BaseException:
        print(scheduler.tail())
        raise
    finally:
        await scheduler.kill()
        await producer.stop()
        await nodes.stop()

    counts = await event_counts(database_url, pool)
    assert (counts["JobAccepted"], counts["JobDispatched"], counts["JobSucceeded"]) == (jobs, jobs, jobs)
    assert counts.get("InputRejected", 0) == 0, counts
    assert len(nodes.attempts) == jobs
    assert all(len(attempts) == 1 for attempts in nodes.attempts.values())  # no duplicate dispatch
    assert await store.last_seq(pool) == expected_inputs  # every input decided exactly once
    await assert_recovery_matches_replay(store, pool)
    await assert_every_input_answered(kafka_bootstrap, topics, store, pool)  # despite the kills (#18)


# ----- broker restart ---------------------------------------------------------------------------------


class RestartableBroker:
    """A dedicated broker from ``deploy/local/kafka.sh``; ``restart()`` stops and relaunches its JVM
    with the same command line, so it comes back on the same port with its data."""

    def __init__(self) -> None:
        self.service = LocalService("kafka.sh", "KAFKA_RUN_DIR", "bootstrap")
        self.bootstrap = ""
        self.relaunched: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        self.bootstrap = self.service.start()
        return self.bootstrap

    @property
    def pid_file(self) -> Path:
        return self.service.run_dir / "kafka.pid"

    async def restart(self) -> float:
        """Stop the broker (SIGTERM, controlled shutdown), start it again; return the seconds it was away."""
        pid = int(self.pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        began = time.monotonic()
        os.kill(pid, signal.SIGTERM)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"

        await wait_until(gone, 60, "the broker to stop", interval=0.1)
        with (self.service.run_dir / "logs" / "server.out").open("ab") as out:
            self.relaunched = subprocess.Popen(
                [part.decode() for part in cmdline], stdout=out, stderr=out, start_new_session=True
            )
        self.pid_file.write_text(str(self.relaunched.pid))
        await wait_until(self._accepts, 90, "the broker to accept produce requests again", interval=0.5)
        return time.monotonic() - began

    async def _accepts(self) -> bool:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, request_timeout_ms=3000)
        try:
            await producer.start()
            await producer.send_and_wait("broker-probe", b"x")
            return True
        except KafkaError:
            return False
        finally:
            await producer.stop()

    def stop(self) -> None:
        self.service.stop()  # SIGTERM to the pid in kafka.pid (the relaunched JVM), data removed
        if self.relaunched is not None:
            try:
                self.relaunched.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.relaunched.kill()
                self.relaunched.wait()


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[RestartableBroker]:
    made = RestartableBroker()
    try:
        await asyncio.to_thread(made.start)
    except Exception as exc:
        await asyncio.to_thread(made.stop)
        pytest.skip(f"no dedicated broker: {exc}")
    try:
        yield made
    finally:
        await asyncio.to_thread(made.stop)


async def test_broker_restart_under_load(
    broker: RestartableBroker,
    database_url: str,
    pool: str,
    run_id: str,
    tmp_path: Path,
    store: EventStore,
) -> None:
    jobs = 400
    bootstrap = broker.bootstrap
    topics = KafkaTopics(f"it-{run_id}.")
    await ensure_topics(bootstrap, topics, partitions=PARTITIONS)
    service = SchedulerService(scheduler_config(bootstrap, database_url, topics, pool, tmp_path))
    nodes = FakeNodes(bootstrap, topics, pool)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await service.start()
    await nodes.start()
    await producer.start()
    try:
        for message in setup_inputs(run_id):
            await producer.send_and_wait(topics.inputs, encode(message), key=pool.encode())
        for index in range(jobs // 2):
            await producer.send(topics.inputs, encode(submission(run_id, index)), key=pool.encode())
        await producer.flush()

        async def succeeded(count: int) -> bool:
            assert service.failure is None, service.failure
            return (await event_counts(database_url, pool)).get("JobSucceeded", 0) >= count

        await wait_until(lambda: succeeded(jobs // 4), 60, "a quarter of the jobs to succeed")
        away = await broker.restart()
        print(f"broker away for {away:.1f} s")
        for index in range(jobs // 2, jobs):
            await send_retrying(producer, topics.inputs, encode(submission(run_id, index)), pool.encode())
        await wait_until(lambda: succeeded(jobs), 180, "every job to succeed after the restart", interval=0.5)
        assert service.failure is None, service.failure
    finally:
        await producer.stop()
        await nodes.stop()
        await service.stop()

    counts = await event_counts(database_url, pool)
    assert (counts["JobAccepted"], counts["JobDispatched"], counts["JobSucceeded"]) == (jobs, jobs, jobs)
    assert all(len(attempts) == 1 for attempts in nodes.attempts.values())
    await assert_recovery_matches_replay(store, pool)
