"""Benchmark of recovery's memory: ``python -m benchmarks.recovery --events N --store S --json``.

Writes a pool's log of about ``N`` events into a fresh store (``--store sqlite``: a file in a
temporary directory, the embedded mode's log; ``postgres``: ``DATABASE_URL``, or a throwaway one
started with ``deploy/local/postgres.sh``), then recovers it in a fresh child process per reader and
reports that child's peak RSS. The log is a busy pool's: 8 nodes of 32 slots, jobs submitted in
batches of ``BATCH`` and each dispatched job reported SUCCEEDED in the next batch, so nearly every job
has finished (accepted, dispatched, succeeded) and the scheduler's state stays small while the read
model holds every job (``--queued``: no node registers, so every job stays queued, as in
``benchmarks.pipeline --recovery``, and the state holds them all). The entries are stepped through
the core and appended with ``append_many``, as the scheduler's loop does, without its transport.

Readers, each in its own process, the whole log with no snapshot:

* ``scheduler``: the distributed scheduler loading the pool (``Pipeline.runtime``: state plus the
  tail's republication, to a publisher that drops it);
* ``read_model``: what Describe answers from, folded from the log with the core's state: the embedded
  shell's ``recover`` (SQLite) or the gateway's ``LogProjector`` (PostgreSQL).

Keys: ``events`` and ``inputs`` in the log, ``populate_seconds``; per reader ``peak_rss_mb`` (the
child's ``ru_maxrss``), ``base_rss_mb`` (the same child after its imports, before reading),
``seconds`` and ``events_per_s`` of the recovery, ``state_jobs`` (jobs in the core's state) and, for
``read_model``, ``read_model_jobs``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.pipeline import NoSnapshots, NullPublisher, infrastructure
from benchmarks.pipeline_workload import report, setup_inputs, submission
from benchmarks.report import print_result
from gpuquota.adapters.event_store import BatchEntry, EventStore
from gpuquota.core import ClusterState, step
from gpuquota.wire import events as ev
from gpuquota.wire.inputs import SchedulerInput

POOL = "bench"
BATCH = 200
"""Submissions per appended batch; the reports of a batch's dispatches go into the next one."""
READERS = ("scheduler", "read_model")


async def open_store(kind: str, where: str) -> EventStore:
    if kind == "sqlite":
        from gpuquota.adapters.sqlite_store import SqliteEventStore

        return await SqliteEventStore.open(where)
    from gpuquota.adapters.postgres_store import PostgresEventStore

    return await PostgresEventStore.connect(where)


# ----- the log ---------------------------------------------------------------------------------------


async def populate(store: EventStore, events: int, queued: bool = False) -> tuple[int, int]:
    """A busy pool's log of at least ``events`` events (``queued``: no node); (events, inputs) written."""
    state, seq, written, at = ClusterState(heartbeat_timeout_ms=10**12), 0, 0, 1_700_000_000_000
    done: list[SchedulerInput] = []
    pending: list[SchedulerInput] = list(setup_inputs("r", register_nodes=not queued))
    index = 0
    while written < events:
        pending.extend(submission("r", index + i, at) for i in range(BATCH))
        index += BATCH
        entries: list[BatchEntry] = []
        for message in [*done, *pending]:
            decided = step(state, message)
            entries.append((message, decided, None))
            written += len(decided)
        done = [
            report(e.attempt_id, e.placements[0].node_id, e.job_id, at)
            for _, decided, _ in entries
            for e in decided
            if isinstance(e, ev.JobDispatched)
        ]
        seq = await store.append_many(POOL, seq, entries)
        pending, at = [], at + 100
    return written, seq


# ----- one reader, in a child process ------------------------------------------------------------


async def read_back(kind: str, where: str, reader: str) -> dict[str, Any]:
    base = _peak_rss_mb()
    store = await open_store(kind, where)
    began = time.monotonic()
    try:
        if reader == "scheduler":
            from gpuquota.scheduler.pipeline import Pipeline

            pipeline = Pipeline(NoSnapshots(store), NullPublisher())
            state = (await pipeline.runtime(POOL)).state
            extra: dict[str, Any] = {}
        else:
            state, jobs = await _read_model(kind, store)
            extra = {"read_model_jobs": jobs}
        seconds = time.monotonic() - began
    finally:
        await store.close()
    return {
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "base_rss_mb": round(base, 1),
        "seconds": round(seconds, 2),
        "state_jobs": len(state.jobs),
        **extra,
    }


async def _read_model(kind: str, store: EventStore) -> tuple[ClusterState, int]:
    """The embedded shell's recovery (SQLite) or the gateway's projection (PostgreSQL)."""
    if kind == "sqlite":
        from gpuquota.scheduler.shell import SchedulerShell

        shell = SchedulerShell(store, pool=POOL)
        await shell.recover()
        return shell.state, len(shell.read_model.jobs)
    from gpuquota.gateway.log_tail import LogProjector
    from gpuquota.read.projection import Projector

    projector = LogProjector(store, Projector(), POOL)
    await projector.catch_up()
    return projector.state, len(projector.read_model.jobs)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, where: str, reader: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.recovery", "--store", kind, "--child", reader, where]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise RuntimeError(f"{reader} recovery failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# ----- the run -------------------------------------------------------------------------------------


async def run(kind: str, events: int, readers: tuple[str, ...], queued: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gpuquota-bench-recovery."))
    try:
        if kind == "sqlite":
            return await _measure(kind, str(workdir / "log.db"), events, readers, queued)
        async with infrastructure(need_kafka=False) as (_, database):
            return await _measure(kind, database, events, readers, queued)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _measure(
    kind: str, where: str, events: int, readers: tuple[str, ...], queued: bool
) -> dict[str, Any]:
    store = await open_store(kind, where)
    if kind == "postgres":
        await _empty(store)
    began = time.monotonic()
    try:
        written, inputs = await populate(store, events, queued)
    finally:
        await store.close()
    result: dict[str, Any] = {
        "store": kind,
        "queued": queued,
        "events": written,
        "inputs": inputs,
        "populate_seconds": round(time.monotonic() - began, 1),
    }
    for reader in readers:
        read = result[reader] = await asyncio.to_thread(_child, kind, where, reader)
        read["events_per_s"] = round(written / max(read["seconds"], 1e-9))
    return result


async def _empty(store: EventStore) -> None:
    """A database from the environment may hold an earlier run's pool: start from an empty log."""
    pool = getattr(store, "_pool")  # noqa: B009 - the benchmark's own cleanup, not the store's API
    await pool.execute("DELETE FROM events WHERE pool = $1", POOL)
    await pool.execute("DELETE FROM inputs WHERE pool = $1", POOL)
    await pool.execute("DELETE FROM consumer_positions WHERE pool = $1", POOL)
    await pool.execute("DELETE FROM snapshots WHERE pool = $1", POOL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.recovery", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--events", type=int, default=200_000, help="events in the log (default 200000)")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--queued", action="store_true", help="no node: every job stays queued")
    parser.add_argument("--reader", choices=READERS, action="append", help="only these readers (repeatable)")
    parser.add_argument("--child", choices=READERS, help=argparse.SUPPRESS)
    parser.add_argument("where", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(asyncio.run(read_back(args.store, args.where, args.child))))
        return 0
    result = asyncio.run(run(args.store, args.events, tuple(args.reader or READERS), args.queued))
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
