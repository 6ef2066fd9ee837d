"""The distributed scheduler's CPU per job, without a broker: ``python -m benchmarks.pipeline_cpu --json``.

``benchmarks.pipeline`` measures the whole pipeline, whose throughput on a shared 2-vCPU machine says
more about the neighbours than about the code. This measures what the scheduler process spends on one
job that does not depend on them: the agent's loop body, ``Pipeline.handle_batch``, over batches of
``--batch`` records (the workload of ``benchmarks.pipeline``: ``SubmitJob`` and the ``AttemptReport``
SUCCEEDED answering each ``RunAttempt`` of the batch before, 8 nodes x 32 slots, 4 shares), appended
to PostgreSQL (``DATABASE_URL``, or a throwaway one started here) and published through the real
``FaustPublisher`` into aiokafka record batches that are built but not sent (no broker).

Reported: ``cpu_ms_per_job``, this process's CPU time inside ``handle_batch`` (and the publications'
record batches) per job; building the inputs is not counted. Not counted either: faust's delivery,
the consumer thread and the producer's sends, which ``benchmarks.pipeline`` includes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Sequence
from types import SimpleNamespace
from typing import Any, cast

from aiokafka.producer.message_accumulator import BatchBuilder

from benchmarks.pipeline import infrastructure
from benchmarks.pipeline_workload import now_ms, report, setup_inputs, submission
from benchmarks.report import print_result
from benchmarks.server_cpu import HostCpu
from gpuquota.adapters.kafka import KafkaTopics, encode
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.scheduler.faust_app import FaustPublisher
from gpuquota.scheduler.loop import GC_THRESHOLDS, JobStateRecord
from gpuquota.scheduler.pipeline import Pipeline, SourceRecord
from gpuquota.wire import inputs as inp
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.node_commands import NodeCommand, RunAttempt

PARTITIONS = 8
BATCH_BYTES = 512 * 1024


class _UnsentProducer:
    """What ``FaustPublisher`` uses of aiokafka's producer: batches are built, then dropped."""

    def _ensure_producer(self) -> _UnsentProducer:
        return self

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(BATCH_BYTES, 0)

    async def send_batch(self, builder: BatchBuilder, topic: str, partition: int) -> asyncio.Future[None]:
        builder._build()  # the bytes the sender would write
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered


class _Publisher(FaustPublisher):
    """``FaustPublisher`` without a broker, keeping the ``RunAttempt``s for the node reports."""

    def __init__(self, topics: KafkaTopics) -> None:
        super().__init__(cast(Any, SimpleNamespace(producer=_UnsentProducer())), topics)
        self.attempts: list[RunAttempt] = []

    async def publish(
        self,
        records: Sequence[JobStateRecord],
        commands: Sequence[NodeCommand],
        results: Sequence[InputResult] = (),
    ) -> list[Awaitable[object]]:
        self.attempts.extend(c for c in commands if isinstance(c, RunAttempt))
        return await super().publish(records, commands, results)


async def measure(jobs: int, batch: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    pool, topics = f"cpu-{run}", KafkaTopics(f"cpu-{run}.")
    gc.set_threshold(*GC_THRESHOLDS)  # as ``gpuquota scheduler``
    async with infrastructure(need_kafka=False) as (_, database):
        store = await PostgresEventStore.connect(database)
        publisher = _Publisher(topics)
        pipeline = Pipeline(store, publisher)
        offsets, host = iter(range(sys.maxsize)), HostCpu().start()

        def records(messages: Sequence[inp.SchedulerInput]) -> list[SourceRecord]:
            return [SourceRecord("in", 0, next(offsets), pool.encode(), encode(m)) for m in messages]

        await pipeline.handle_batch(records(setup_inputs(run)))
        gc.freeze()  # as ``gpuquota scheduler`` after start-up
        cpu = 0.0
        submitted = 0
        while submitted < jobs or publisher.attempts:  # until every job has run
            reports = [report(a.attempt_id, a.node_id, a.job_id, now_ms()) for a in publisher.attempts]
            publisher.attempts.clear()
            new = [submission(run, i) for i in range(submitted, min(jobs, submitted + batch // 2))]
            submitted += len(new)
            taken = records([*new, *reports])
            began = time.process_time()
            await pipeline.handle_batch(taken)
            cpu += time.process_time() - began
        began = time.process_time()
        await pipeline.flush()
        cpu += time.process_time() - began
        await pipeline.close()
        await store.close()
    return {
        "jobs": jobs,
        "batch": batch,
        "decided": pipeline.stats.decided,
        "cpu_ms_per_job": round(cpu * 1000 / max(1, jobs), 3),
        "host_cpu_seconds": host.stop(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pipeline_cpu", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--jobs", type=int, default=4000, help="jobs submitted (default 4000)")
    parser.add_argument("--batch", type=int, default=200, help="records per batch (default 200)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL"):
        print("DATABASE_URL is not set: starting a throwaway PostgreSQL", file=sys.stderr)
    print_result(asyncio.run(measure(args.jobs, max(2, args.batch))), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
