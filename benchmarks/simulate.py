"""Benchmark of the simulator: ``python -m benchmarks.simulate --jobs N --json``.

Workload: a 1,000-instance pool (one unit) split into four quota shares (borrowing with in-share
preemption, lending, borrowing, reserved), and N jobs arriving at about 1,400 an hour with a daily
cycle, log-normal durations (median 10 min) and gangs of 1 to 8: 1,000,000 jobs are about a month,
and the pool runs at about 70 % on average, full with queues at the daily peaks. The trace is streamed
from the generator in a child process (``gpuquota.sim.prefetch``), as ``simulate`` streams a large
trace file. Prints ``jobs``, ``events`` (the core's),
``wall_seconds``, ``simulated_days``, ``jobs_per_s`` and ``peak_rss_mb`` (one JSON object with
``--json``), and the load average, since the figure depends on what else the machine runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import time
from typing import Any

from benchmarks.report import print_result
from benchmarks.server_cpu import HostCpu
from gpuquota.native import loader as _native
from gpuquota.sim.config import Configuration
from gpuquota.sim.engine import simulate, stderr_progress
from gpuquota.sim.generate import Workload, generate
from gpuquota.sim.prefetch import prefetched
from gpuquota.wire.base import (
    CapacityLimit,
    JobQueueSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    Strategy,
)

UNIT = "ml.p5.48xlarge"
POOL = 1_000
SHARES = (
    ("research", 400, Strategy.LEND_AND_BORROW, 100, True),
    ("product", 300, Strategy.LEND, -1, False),
    ("batch", 200, Strategy.LEND_AND_BORROW, 200, False),
    ("urgent", 100, Strategy.RESERVE, -1, False),
)


def configuration() -> Configuration:
    shares = tuple(
        QuotaShareSpec(
            name=name,
            job_queue="jq",
            capacity_limits=(CapacityLimit(unit=UNIT, max_capacity=limit),),
            strategy=strategy,
            borrow_limit=borrow,
            in_share_preemption=in_share,
        )
        for name, limit, strategy, borrow, in_share in SHARES
    )
    return Configuration(
        "benchmark",
        SchedulingPolicySpec(name="policy"),
        ServiceEnvironmentSpec(name="se", capacity_limits=(CapacityLimit(unit=UNIT, max_capacity=POOL),)),
        JobQueueSpec(name="jq", service_environment="se", scheduling_policy="policy"),
        tuple(sorted(shares, key=lambda s: s.name)),
    )


def workload(jobs: int, seed: int) -> Workload:
    return Workload(
        shares="research:4,product:3,batch:2,urgent:1",
        unit=UNIT,
        jobs=jobs,
        rate_per_hour=1_400,
        cycle=0.6,
        median_duration=600,
        sigma=1.0,
        max_duration=3 * 86_400,
        priorities="0:3,5:1",
        gang_sizes="1:10,2:3,4:1,8:1",
        checkpoint_every=900,
        preemption_retries=5,
        seed=seed,
    )


def run(jobs: int, seed: int, progress: bool) -> dict[str, Any]:
    config = configuration()
    load_before, host = os.getloadavg()[0], HostCpu().start()
    started, cpu_started = time.perf_counter(), time.process_time()
    trace = prefetched(functools.partial(generate, workload(jobs, seed)))
    result = simulate(config, trace, progress=stderr_progress("benchmark") if progress else None)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "jobs": jobs,
        "events": result.events,
        "inputs": result.inputs,
        "wall_seconds": round(wall, 2),
        "simulated_days": round((result.end_ms - result.start_ms) / 86_400_000, 2),
        "jobs_per_s": round(jobs / wall, 1),
        "cpu_seconds": round(cpu, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "reader_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        "preemptions": sum(c.preemptions for c in result.counters),
        "finished": sum(c.finished for c in result.counters),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "host_cpu_seconds": host.stop(),
        "python": sys.version.split()[0],
        "core": _native.core_mode(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.simulate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs in the trace (N)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    result = run(args.jobs, args.seed, progress=not args.json or sys.stderr.isatty())
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
