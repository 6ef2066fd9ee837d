"""Benchmark of the distributed pipeline: ``python -m benchmarks.pipeline --rate R --seconds S --json``.

Throughput run: a ``gpuquota scheduler`` process on a real broker and database; this process submits
``R`` jobs per second for ``S`` seconds (``SubmitJob`` straight to the inputs topic), plays the node
agents (it answers every ``RunAttempt`` with an ``AttemptReport`` SUCCEEDED, so capacity is freed), and
watches ``gpuquota.job-state``. Reported:

* ``jobs_per_s``: jobs that reached SCHEDULED, per second from the first submission to the last dispatch;
* ``submit_to_scheduled_p50_ms`` / ``_p99_ms``: from just before the produce call to the moment the
  ``JobDispatched`` record is read here (wall clock of this process);
* ``lost_jobs``: submitted jobs never seen SCHEDULED (the run ends when all are, or when for ``--drain``
  seconds no dispatch came and the scheduler decided no input: a saturated scheduler decides the
  ``AttemptReport`` records that free slots only after the submissions queued before them in the pool's
  partition, so its dispatches pause while it works off that backlog);
* ``undecided_inputs``: records of the inputs topic the scheduler had not decided when the run ended
  (0 unless it stopped reading: then ``lost_jobs`` are jobs it never got to);
* ``duplicate_dispatches``: ``JobDispatched`` events (distinct event ids) beyond the first per job;
* ``cpu_ms_per_job``: CPU time per submitted job of this process (``client``) and of the scheduler;
* with ``--windows W``: ``window_p99_ms``, the p99 of the jobs submitted in each ``W``-second window,
  ``submit_to_published_p99_ms`` (to the ``JobDispatched`` record's timestamp: the moment the scheduler
  produced it; what is left to the p99 above is the broker and this process reading it back),
  and ``dispatch_gaps_ms``, the longest pauses between consecutive dispatches (with the second of the
  run they began in): a stall shows as one window's p99 and one long gap.

``--recovery EVENTS``: decides about ``EVENTS`` submissions into a pool's log through the scheduler's
``Pipeline`` (no Kafka; in batches of ``POPULATE_BATCH`` records, as the agent hands them over), then
times how long a fresh ``Pipeline`` takes to load the pool from the latest snapshot plus the log tail
(``recovery_seconds``), and from the whole log with snapshots ignored (``full_replay_seconds``).

Kafka and PostgreSQL come from ``KAFKA_BOOTSTRAP_SERVERS`` / ``DATABASE_URL``; when unset, the
benchmark starts throwaway ones with ``deploy/local/kafka.sh`` / ``deploy/local/postgres.sh`` (the
broker with C2, ``KAFKA_JIT_OPTS=""``, unless that is set: start yours the same way).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from benchmarks.pipeline_drain import until_idle
from benchmarks.report import print_result
from gpuquota.adapters.event_store import EventStore, Snapshot
from gpuquota.adapters.kafka import KafkaTopics, encode, ensure_topics
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.scheduler.pipeline import JobStateRecord, Pipeline, PipelineSettings, SourceRecord
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    CapacityLimit,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    Strategy,
)
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.events import EVENT_ADAPTER, JobDispatched
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NODE_COMMAND_ADAPTER, NodeCommand, RunAttempt

ROOT = Path(__file__).resolve().parents[1]
UNIT = "ml.g5.xlarge"
NODES = 8
SLOTS_PER_NODE = 32
SHARES = 4
POPULATE_BATCH = 500
FETCH_WAIT_MS = 20
"""The benchmark's consumers read every partition; with aiokafka's default (500 ms) a fetch that leaves
out the partitions whose records are being read parks on the idle ones, and every answer to a
``RunAttempt`` (so every slot's next dispatch: 256 slots at 1,000 jobs/s must turn over within 256 ms)
and every observed dispatch waited up to that long. A node agent reads only its own partition."""
FETCH_MIN_BYTES = 64 * 1024
"""A fetch waits (at most ``FETCH_WAIT_MS``) for this much: fewer fetches, less CPU for this process."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ----- infrastructure ------------------------------------------------------------------------------


def _launch(script: str, run_dir_var: str, result: str, run_dir: Path) -> str:
    env = {**os.environ, run_dir_var: str(run_dir), "KAFKA_PYTHON": sys.executable}
    env.setdefault("KAFKA_JIT_OPTS", "")  # the broker's C2 compiler: ~0.15 ms of its CPU per job, not ~0.25
    env.pop("DATABASE_URL", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "deploy/local" / script), "start"], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script} start failed:\n{proc.stderr[-3000:]}")
    return (run_dir / result).read_text().strip()


def _stop(script: str, run_dir_var: str, run_dir: Path) -> None:
    env = {**os.environ, run_dir_var: str(run_dir)}
    subprocess.run(["bash", str(ROOT / "deploy/local" / script), "stop"], env=env, capture_output=True)
    shutil.rmtree(run_dir, ignore_errors=True)


@asynccontextmanager
async def infrastructure(need_kafka: bool = True) -> AsyncIterator[tuple[str, str]]:
    """(bootstrap servers, database URL): from the environment, or started here and stopped after."""
    started: list[tuple[str, str, Path]] = []
    try:
        kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        if not kafka and need_kafka:
            run_dir = Path(tempfile.mkdtemp(prefix="gpuquota-bench-kafka."))
            started.append(("kafka.sh", "KAFKA_RUN_DIR", run_dir))
            kafka = await asyncio.to_thread(_launch, "kafka.sh", "KAFKA_RUN_DIR", "bootstrap", run_dir)
        database = os.environ.get("DATABASE_URL", "")
        if not database:
            run_dir = Path(tempfile.mkdtemp(prefix="gpuquota-bench-pg."))
            started.append(("postgres.sh", "PG_RUN_DIR", run_dir))
            database = await asyncio.to_thread(_launch, "postgres.sh", "PG_RUN_DIR", "url", run_dir)
        yield kafka, database
    finally:
        for script, var, run_dir in reversed(started):
            await asyncio.to_thread(_stop, script, var, run_dir)


# ----- workload ------------------------------------------------------------------------------------


def setup_inputs(
    run: str, nodes: int = NODES, slots: int = SLOTS_PER_NODE, *, register_nodes: bool = True
) -> list[SchedulerInput]:
    """Policy, one service environment over ``nodes`` x ``slots`` instances, one queue, LEND shares,
    and the nodes (unless ``register_nodes`` is false: then every job submitted stays queued)."""
    capacity = nodes * slots
    made: list[SchedulerInput] = []

    def add(kind: type[Any], **fields: Any) -> None:
        made.append(kind(event_id=f"{run}/setup/{len(made)}", occurred_at=now_ms(), **fields))

    add(inp.CreateSchedulingPolicy, spec=SchedulingPolicySpec(name="policy"))
    limits = (CapacityLimit(unit=UNIT, max_capacity=capacity),)
    add(inp.CreateServiceEnvironment, spec=ServiceEnvironmentSpec(name="se", capacity_limits=limits))
    spec = JobQueueSpec(name="jq", service_environment="se", scheduling_policy="policy")
    add(inp.CreateJobQueue, spec=spec)
    for index in range(SHARES):
        share = QuotaShareSpec(
            name=f"s{index}",
            job_queue="jq",
            capacity_limits=(CapacityLimit(unit=UNIT, max_capacity=capacity // SHARES),),
            strategy=Strategy.LEND_AND_BORROW,
        )
        add(inp.CreateQuotaShare, spec=share)
    for index in range(nodes if register_nodes else 0):
        offers = tuple(SlotOffer(unit=UNIT) for _ in range(slots))
        add(inp.RegisterNode, node_id=f"node-{index}", slots=offers)
    return made


def submission(run: str, index: int) -> inp.SubmitJob:
    at = now_ms()
    spec = JobSpec(
        job_id=f"{run}-job-{index}",
        job_name=f"job-{index}",
        job_queue="jq",
        quota_share=f"s{index % SHARES}",
        unit=UNIT,
        created_at=at,
    )
    return inp.SubmitJob(event_id=f"{run}/submit/{index}", occurred_at=at, job=spec)


# ----- throughput --------------------------------------------------------------------------------


class Watch:
    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.scheduled: dict[str, float] = {}
        self.published: dict[str, float] = {}
        """When the scheduler produced the job's first ``JobDispatched`` (the record's timestamp)."""
        self.dispatch_ids: dict[str, set[str]] = {}
        self.first_submit = 0.0
        self.last_scheduled = 0.0
        self.inputs_sent = 0
        """Inputs produced: setup, submissions and the node player's reports."""
        self.inputs_decided = 0
        """The scheduler's recorded position in the pool's partition of the inputs topic."""


async def _scheduler_process(env: dict[str, str], log_path: Path) -> asyncio.subprocess.Process:
    with log_path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuquota", "scheduler",
            env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=log,
        )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(120):
        while b"ready" not in (line := await proc.stdout.readline()):
            if not line:
                raise RuntimeError(f"gpuquota scheduler exited; see {log_path}")
    return proc


async def _started_consumer(kafka: str, topic: str) -> AIOKafkaConsumer:
    """A consumer of ``topic`` from its start that fetches as soon as there is something to read."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_WAIT_MS,
        fetch_min_bytes=FETCH_MIN_BYTES,
    )
    await consumer.start()
    return consumer


async def _answer_nodes(kafka: str, topics: KafkaTopics, pool: str, watch: Watch) -> None:
    """Plays every node agent: each RunAttempt is answered at once with SUCCEEDED. With a producer of
    its own, as a node agent has: sharing the submissions' producer, a report waited behind their
    batches (up to 15 s on a loaded machine) and no command was read meanwhile."""
    consumer = await _started_consumer(kafka, topics.node_commands)
    producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True, linger_ms=2)
    await producer.start()
    try:
        async for record in consumer:
            command = NODE_COMMAND_ADAPTER.validate_json(record.value or b"")
            if isinstance(command, RunAttempt):
                report = inp.AttemptReport(
                    event_id=f"{command.attempt_id}/done",  # not chained: ids must stay short
                    occurred_at=now_ms(),
                    node_id=command.node_id,
                    job_id=command.job_id,
                    attempt_id=command.attempt_id,
                    status="SUCCEEDED",
                    exit_code=0,
                )
                await producer.send(topics.inputs, encode(report), key=pool.encode())
                watch.inputs_sent += 1
    finally:
        await consumer.stop()
        await producer.stop()


async def _observe(kafka: str, topics: KafkaTopics, watch: Watch) -> None:
    consumer = await _started_consumer(kafka, topics.job_state)
    try:
        async for record in consumer:
            if b'"JobDispatched"' not in (record.value or b""):
                continue
            event = EVENT_ADAPTER.validate_json(record.value or b"")
            assert isinstance(event, JobDispatched)
            watch.dispatch_ids.setdefault(event.job_id, set()).add(event.event_id)
            if event.job_id not in watch.scheduled:
                watch.scheduled[event.job_id] = time.time()
                watch.published[event.job_id] = record.timestamp / 1000
                watch.last_scheduled = watch.scheduled[event.job_id]
    finally:
        await consumer.stop()


async def throughput(rate: float, seconds: float, drain: float, windows: float = 0.0) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    topics, pool = KafkaTopics(f"bench-{run}."), f"bench-{run}"
    workdir = Path(tempfile.mkdtemp(prefix="gpuquota-bench."))
    async with infrastructure() as (kafka, database):
        await ensure_topics(kafka, topics)
        env = {
            "GPUQUOTA_KAFKA": kafka,
            "GPUQUOTA_DATABASE_URL": database,
            "GPUQUOTA_TOPIC_PREFIX": topics.prefix,
            "GPUQUOTA_POOL": pool,
            "GPUQUOTA_DATA_DIR": str(workdir),
            "GPUQUOTA_HEARTBEAT_SECONDS": "600",  # the benchmark sends no heartbeats
            "GPUQUOTA_LOG_LEVEL": "WARNING",
        }
        scheduler = await _scheduler_process(env, workdir / "scheduler.log")
        producer = AIOKafkaProducer(bootstrap_servers=kafka, enable_idempotence=True, linger_ms=2)
        await producer.start()
        watch = Watch()
        tasks = [
            asyncio.create_task(_answer_nodes(kafka, topics, pool, watch)),
            asyncio.create_task(_observe(kafka, topics, watch)),
        ]
        try:
            for message in setup_inputs(run):
                await producer.send_and_wait(topics.inputs, encode(message), key=pool.encode())
                watch.inputs_sent += 1
            total = int(rate * seconds)
            start = time.monotonic()
            watch.first_submit = time.time()
            for index in range(total):
                delay = start + index / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing the submission rate
                message = submission(run, index)
                watch.submitted[message.job.job_id] = time.time()
                await producer.send(topics.inputs, encode(message), key=pool.encode())
                watch.inputs_sent += 1
            await producer.flush()
            await _drain(watch, total, drain, database, pool)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await producer.stop()
            scheduler.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(scheduler.wait(), 30)
            except TimeoutError:
                scheduler.kill()
                await scheduler.wait()
    shutil.rmtree(workdir, ignore_errors=True)
    summary = _summary(watch, rate, seconds, windows)
    jobs = max(1, len(watch.submitted))
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    summary["cpu_ms_per_job"] = {
        "client": round((own.ru_utime + own.ru_stime) * 1000 / jobs, 3),
        "scheduler": round((children.ru_utime + children.ru_stime) * 1000 / jobs, 3),
    }  # the scheduler is the only child process waited for (without infrastructure started here)
    return summary


async def _drain(watch: Watch, total: int, drain: float, database: str, pool: str) -> None:
    """Until every job is dispatched and every input decided, or the scheduler is idle (pipeline_drain)."""
    store = await PostgresEventStore.connect(database, migrate=False)

    async def progress() -> tuple[int, int]:
        watch.inputs_decided = sum((await store.positions(pool)).values())  # its one partition
        return len(watch.scheduled), watch.inputs_decided

    def finished() -> bool:
        return len(watch.scheduled) >= total and watch.inputs_decided >= watch.inputs_sent

    try:
        await until_idle(progress, finished, drain)
    finally:
        await store.close()


def _summary(watch: Watch, rate: float, seconds: float, windows: float = 0.0) -> dict[str, Any]:
    latencies = sorted(
        (watch.scheduled[j] - t) * 1000 for j, t in watch.submitted.items() if j in watch.scheduled
    )
    span = max(watch.last_scheduled - watch.first_submit, 1e-9)
    return {
        "rate": rate,
        "seconds": seconds,
        "submitted": len(watch.submitted),
        "scheduled": len(watch.scheduled),
        "jobs_per_s": round(len(watch.scheduled) / span, 1),
        "submit_to_scheduled_p50_ms": round(_quantile(latencies, 0.50), 1),
        "submit_to_scheduled_p99_ms": round(_quantile(latencies, 0.99), 1),
        "lost_jobs": sum(1 for j in watch.submitted if j not in watch.scheduled),
        "undecided_inputs": max(0, watch.inputs_sent - watch.inputs_decided),
        "duplicate_dispatches": sum(len(ids) - 1 for ids in watch.dispatch_ids.values()),
        **(_windows(watch, windows) if windows > 0 else {}),
    }


def _windows(watch: Watch, width: float) -> dict[str, Any]:
    """Where the latency comes from: p99 per submission window, and the longest dispatch gaps."""
    by_window: dict[int, list[float]] = {}
    for job, at in watch.submitted.items():
        if job in watch.scheduled:
            index = int((at - watch.first_submit) // width)
            by_window.setdefault(index, []).append((watch.scheduled[job] - at) * 1000)
    published = sorted(
        (watch.published[job] - at) * 1000 for job, at in watch.submitted.items() if job in watch.published
    )
    dispatched = sorted(watch.scheduled.values())
    gaps = sorted(((b - a) * 1000, a - watch.first_submit) for a, b in itertools.pairwise(dispatched))[-5:]
    return {
        "window_p99_ms": [round(_quantile(sorted(v), 0.99)) for _, v in sorted(by_window.items())],
        "submit_to_published_p99_ms": round(_quantile(published, 0.99), 1),
        "dispatch_gaps_ms": [[round(gap), round(at, 1)] for gap, at in reversed(gaps)],
    }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[min(998, int(q * 1000) - 1)]


# ----- recovery ----------------------------------------------------------------------------------


class NullPublisher:
    async def publish(
        self,
        records: Sequence[JobStateRecord],
        commands: Sequence[NodeCommand],
        results: Sequence[InputResult] = (),
    ) -> list[Awaitable[object]]:
        return []

    async def dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        pass


class NoSnapshots:
    """The store with its snapshots hidden: recovery replays the whole log."""

    def __init__(self, store: EventStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def latest_snapshot(self, pool: str) -> Snapshot | None:
        return None


async def recovery(events: int, snapshot_every: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    pool = f"bench-{run}"
    async with infrastructure(need_kafka=False) as (_, database):
        writer = await PostgresEventStore.connect(database)
        pipeline = Pipeline(writer, NullPublisher(), PipelineSettings(snapshot_every=snapshot_every))
        messages: list[SchedulerInput] = [
            *setup_inputs(run, register_nodes=False),  # capacity but no node: every job stays queued
            *(submission(run, i) for i in range(events)),
        ]
        started = time.monotonic()
        for first in range(0, len(messages), POPULATE_BATCH):  # batches, as the agent hands them over
            batch = [
                SourceRecord("bench", 0, offset, pool.encode(), encode(message))
                for offset, message in enumerate(messages[first : first + POPULATE_BATCH], start=first)
            ]
            await pipeline.handle_batch(batch)
        await pipeline.flush()
        populate = time.monotonic() - started
        recorded = sum(len(r.events) for r in await writer.read(pool, limit=len(messages) + 1))
        await writer.close()

        timings: dict[str, float] = {}
        for name, wrap in (("recovery_seconds", False), ("full_replay_seconds", True)):
            store = await PostgresEventStore.connect(database)
            try:
                reader = Pipeline(NoSnapshots(store) if wrap else store, NullPublisher())
                began = time.monotonic()
                await reader.runtime(pool)
                timings[name] = round(time.monotonic() - began, 3)
                await reader.close()  # not the snapshot a long tail triggers
            finally:
                await store.close()
    return {
        "events": recorded,
        "inputs": len(messages),
        "snapshot_every": snapshot_every,
        "populate_seconds": round(populate, 1),
        **timings,
    }


# ----- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pipeline", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rate", type=float, default=100.0, help="submissions per second (default 100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to submit (default 10)")
    idle = "end after this long with no dispatch and no input decided"
    parser.add_argument("--drain", type=float, default=10.0, help=idle)
    parser.add_argument("--recovery", type=int, metavar="EVENTS", help="measure recovery over EVENTS events")
    parser.add_argument("--snapshot-every", type=int, default=1000, help="snapshot period (--recovery)")
    parser.add_argument("--windows", type=float, default=0.0, metavar="W", help="p99 per W-second window")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.recovery is not None:
        result = asyncio.run(recovery(args.recovery, args.snapshot_every))
    else:
        result = asyncio.run(throughput(args.rate, args.seconds, args.drain, args.windows))
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
