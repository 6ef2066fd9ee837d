"""Benchmark of the distributed pipeline: ``python -m benchmarks.pipeline --rate R --seconds S --json``.

Throughput run: a ``gpuquota scheduler`` process on a real broker and database; this process submits
``R`` jobs per second for ``S`` seconds (``SubmitJob`` straight to the inputs topic), plays the node
agents (it answers every ``RunAttempt`` with an ``AttemptReport`` SUCCEEDED, so capacity is freed), and
watches ``gpuquota.job-state``. This process shares the machine with what it measures, so it does that
at the least CPU it can (``benchmarks.pipeline_load``: records from templates, one record batch per
10 ms of submissions and per fetch of node commands, one consumer for node commands and job states,
only the ``JobDispatched`` records parsed). Reported:

* ``jobs_per_s``: jobs that reached SCHEDULED, per second from the first submission to the last dispatch;
* ``submit_to_scheduled_p50_ms`` / ``_p99_ms``: from just before the submission is handed to the
  producer to the moment the fetch that brought its ``JobDispatched`` record returned here (wall clock
  of this process);
* ``lost_jobs``: submitted jobs never seen SCHEDULED (the run ends when all are, or when for ``--drain``
  seconds no dispatch came and the scheduler decided no input: a saturated scheduler decides the
  ``AttemptReport`` records that free slots only after the submissions queued before them in the pool's
  partition, so its dispatches pause while it works off that backlog);
* ``undecided_inputs``: records of the inputs topic the scheduler had not decided when the run ended
  (0 unless it stopped reading: then ``lost_jobs`` are jobs it never got to);
* ``duplicate_dispatches``: ``JobDispatched`` events (distinct event ids) beyond the first per job;
* ``refused``: submissions the gateway's admission control refused (``--max-backlog``, ``--max-backlog-
  seconds``, as ``GPUQUOTA_ADMISSION_MAX_BACKLOG`` / ``_SECONDS``; 0 and 0: none), played by this
  process: a submission counts from its produce until its ``JobAccepted`` is read back, and one refused
  is not sent (a client would retry it later): ``submitted`` counts only those admitted;
* ``cpu_ms_per_job``: CPU time per submitted job, from the first measured submission to the end of the
  run, of this process (``client``), of the scheduler (``scheduler``) and, when the benchmark started
  them itself, of the broker's JVM (``broker``) and of all PostgreSQL's processes (``database``)
  (``benchmarks.server_cpu``; omitted for servers from the environment, which may serve others too);
* ``host_cpu_seconds``: the whole machine's CPU seconds over the same span, summed over its CPUs:
  ``busy``, ``idle`` and ``steal``, the time the hypervisor gave the vCPUs to other machines while
  they had work (``benchmarks.server_cpu.HostCpu``): a run with much steal ran on a slower machine;
* ``calibration_ms``: a fixed piece of pure-Python work timed in this process just before and just
  after that span (``benchmarks.server_cpu.calibration_ms``): the machine's speed, which moves even
  without steal (a neighbour on the same physical core); ``load_average_1m`` at the same two moments;
* with ``--windows W``: ``window_p99_ms``, the p99 of the jobs submitted in each ``W``-second window,
  ``submit_to_published_p99_ms`` (to the ``JobDispatched`` record's timestamp: the moment the scheduler
  produced it; what is left to the p99 above is the broker and this process reading it back),
  ``dispatch_gaps_ms``, the longest pauses between consecutive dispatches (with the second of the
  run they began in): a stall shows as one window's p99 and one long gap; and ``slot_round_trip_ms``
  (p50, p99), from each job's ``JobDispatched`` to its ``JobSucceeded``, both as the scheduler produced
  them (the records' timestamps): how long a slot stays busy (below).

The pool is 8 nodes of ``--slots-per-node`` slots (default 32: 256 slots), and a job ends as soon as
it starts, so a slot stays busy for one round trip of the loop: from the decision that dispatches a
job, through its ``RunAttempt`` to the node player and the ``AttemptReport`` back into the inputs
topic (behind the submissions queued before it), to the decision on that report. At R jobs per second
the pool runs out when that round trip exceeds slots / R seconds (256 slots: 128 ms at 2,000/s, 85 ms
at 3,000/s): jobs then wait for a slot, and that wait is part of submit-to-scheduled.

The measured submissions follow ``--warmup`` seconds (default 10) of the same load, drained, whose jobs
are not counted (``warmup_seconds``): a broker compiles its hot paths under its first load, which one
that has run for a while has done.

``--overload F``: runs at the sustainable rate (``--rate auto``: found by the benchmark) and at ``F``
times it, each on fresh servers, with the admission control given (``benchmarks.pipeline_overload``).

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
import gc
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

from benchmarks.pipeline_drain import until_idle
from benchmarks.pipeline_load import PoolSender, Watch, play_nodes_and_observe, started_producer, submit
from benchmarks.pipeline_overload import overload
from benchmarks.pipeline_workload import NODES, SLOTS_PER_NODE
from benchmarks.pipeline_workload import setup_inputs as setup_inputs
from benchmarks.pipeline_workload import submission as submission
from benchmarks.report import print_result
from benchmarks.server_cpu import HostCpu, ServerCpu, broker_pid, postmaster_pid
from gpuquota.adapters.event_store import EventStore, Snapshot
from gpuquota.adapters.kafka import KafkaTopics, encode, ensure_topics
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.gateway.admission import Admission
from gpuquota.scheduler.loop import GC_THRESHOLDS
from gpuquota.scheduler.pipeline import JobStateRecord, Pipeline, PipelineSettings, SourceRecord
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand

ROOT = Path(__file__).resolve().parents[1]
WARMUP_SECONDS = 10.0
"""A broker's JIT compiles its hot paths under the first load it sees (C2: about 27 s of the JVM's CPU
in its first three runs at 2,000 jobs/s, beside 30 s of request handling), which a broker that has run
for a while has done: the measured submissions start after this much load, once it is drained."""
POPULATE_BATCH = 500


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
async def infrastructure(
    need_kafka: bool = True, servers: dict[str, int] | None = None
) -> AsyncIterator[tuple[str, str]]:
    """(bootstrap servers, database URL): from the environment, or started here and stopped after;
    ``servers`` gets the root process of each started here (``broker``, ``database``)."""
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
        if servers is not None:
            servers.update(_server_pids(started))
        yield kafka, database
    finally:
        for script, var, run_dir in reversed(started):
            await asyncio.to_thread(_stop, script, var, run_dir)


def _server_pids(started: list[tuple[str, str, Path]]) -> dict[str, int]:
    pids = {"kafka.sh": ("broker", broker_pid), "postgres.sh": ("database", postmaster_pid)}
    found = {pids[script][0]: pids[script][1](run_dir) for script, _, run_dir in started}
    return {name: pid for name, pid in found.items() if pid is not None}


# ----- throughput --------------------------------------------------------------------------------


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


async def throughput(
    rate: float,
    seconds: float,
    drain: float,
    windows: float = 0.0,
    warmup: float = WARMUP_SECONDS,
    slots_per_node: int = SLOTS_PER_NODE,
    admission: Admission | None = None,
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    topics, pool = KafkaTopics(f"bench-{run}."), f"bench-{run}"
    workdir = Path(tempfile.mkdtemp(prefix="gpuquota-bench."))
    servers: dict[str, int] = {}
    async with infrastructure(servers=servers) as (kafka, database):
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
        producer = await started_producer(kafka)
        watch, cpu = Watch(), ServerCpu({**servers, "scheduler": scheduler.pid})
        host = HostCpu(calibrate=True)
        tasks = [asyncio.create_task(play_nodes_and_observe(kafka, topics, pool, watch))]
        try:
            for message in setup_inputs(run, slots=slots_per_node):
                await producer.send_and_wait(topics.inputs, encode(message), key=pool.encode())
                watch.inputs_sent += 1
            gc.set_threshold(*GC_THRESHOLDS)  # as ``gpuquota scheduler``: no full collection in a run
            gc.freeze()  # of start-up's objects, never freed
            sender = await PoolSender.of(producer, topics.inputs, pool)
            warm = int(rate * warmup)
            if warm:
                await submit(sender, f"{run}-warm", rate, warm, watch)
                await _drain(watch, warm, drain, database, pool)
                warmup_lost = sum(1 for job in watch.submitted if job not in watch.scheduled)
                if warmup_lost:
                    raise RuntimeError(f"{warmup_lost} warm-up jobs were never dispatched")
                watch.restart()
            watch.admission = admission
            total = int(rate * seconds)
            host.start()  # calibrates first, outside the servers' span
            cpu.start()
            client_began = _own_cpu()
            await submit(sender, run, rate, total, watch)
            await producer.flush()
            await _drain(watch, len(watch.submitted), drain, database, pool)
            cpu.stop()
            host.stop()
            cpu.seconds["client"] = _own_cpu() - client_began
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
    summary["warmup_seconds"] = warmup
    summary["refused"] = 0 if admission is None else admission.refused
    summary["slots"] = NODES * slots_per_node
    jobs = max(1, len(watch.submitted))
    order = ("client", "scheduler", "broker", "database")
    per_job = {name: round(cpu.seconds[name] * 1000 / jobs, 3) for name in order if name in cpu.seconds}
    summary["cpu_ms_per_job"] = per_job
    summary.update(host.readings())
    return summary


def _own_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


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
        "duplicate_dispatches": watch.duplicate_dispatches(),
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
    turnovers = sorted((end - watch.published[job]) * 1000 for job, end in watch.ended.items())
    dispatched = sorted(watch.scheduled.values())
    gaps = sorted(((b - a) * 1000, a - watch.first_submit) for a, b in itertools.pairwise(dispatched))[-5:]
    return {
        "window_p99_ms": [round(_quantile(sorted(v), 0.99)) for _, v in sorted(by_window.items())],
        "submit_to_published_p99_ms": round(_quantile(published, 0.99), 1),
        "slot_round_trip_ms": [round(_quantile(turnovers, q), 1) for q in (0.50, 0.99)],
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


def _rate(text: str) -> float | None:
    """``--rate``: jobs per second, or ``auto`` (None)."""
    return None if text == "auto" else float(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pipeline", description=__doc__.splitlines()[0]
    )
    rate = "submissions per second (default 100); with --overload, auto: find the sustainable rate"
    parser.add_argument("--rate", type=_rate, default=100.0, help=rate)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to submit (default 10)")
    idle = "end after this long with no dispatch and no input decided"
    parser.add_argument("--drain", type=float, default=10.0, help=idle)
    parser.add_argument("--recovery", type=int, metavar="EVENTS", help="measure recovery over EVENTS events")
    parser.add_argument("--snapshot-every", type=int, default=1000, help="snapshot period (--recovery)")
    warm = f"seconds of load before the measured submissions, not measured (default {WARMUP_SECONDS:g})"
    parser.add_argument("--warmup", type=float, default=WARMUP_SECONDS, metavar="S", help=warm)
    slots = f"slots per node, {NODES} nodes (default {SLOTS_PER_NODE}: the pool bounds the rate, see above)"
    parser.add_argument("--slots-per-node", type=int, default=SLOTS_PER_NODE, metavar="N", help=slots)
    parser.add_argument("--windows", type=float, default=0.0, metavar="W", help="p99 per W-second window")
    backlog = "admission control: most undecided submissions (default 0: none; the gateway's is 5000)"
    parser.add_argument("--max-backlog", type=int, default=0, metavar="N", help=backlog)
    age = "admission control: longest wait of the oldest undecided submission (default 0: none)"
    parser.add_argument("--max-backlog-seconds", type=float, default=0.0, metavar="S", help=age)
    factor = "run at --rate, then at F times it: what an overload costs (see above)"
    parser.add_argument("--overload", type=float, metavar="F", help=factor)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    bounded = args.max_backlog or args.max_backlog_seconds
    admission = Admission(args.max_backlog, args.max_backlog_seconds) if bounded else None
    run = {
        "seconds": args.seconds, "drain": args.drain, "windows": args.windows, "warmup": args.warmup,
        "slots_per_node": args.slots_per_node,
    }  # fmt: skip
    if args.recovery is not None:
        result = asyncio.run(recovery(args.recovery, args.snapshot_every))
    elif args.overload is not None:
        result = asyncio.run(overload(throughput, args.overload, args.rate, admission, **run))
    else:
        result = asyncio.run(throughput(args.rate or 100.0, admission=admission, **run))
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
