"""Benchmark of the scheduling core: ``python -m benchmarks.core --queued N --inputs M --json``.

Workload: 10,000 instances across 5 units (8-slot nodes), 20 quota shares with mixed strategies and
borrow limits, N queued jobs of mixed priorities and sizes, then M mixed inputs: submissions,
completions (and stop reports for preempted jobs), priority updates, node events and ticks. Each input
goes through ``step`` (decide and apply in one go), exactly as both shells do (the embedded shell and the
distributed pipeline); ``--mode decide`` runs the pure ``decide`` then ``evolve`` of each event instead.
The latency of an input is the time of that call. ``core`` says whether the compiled core ran
(``make native``). Prints one JSON object (``--json``) or a readable summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.report import print_result
from benchmarks.server_cpu import HostCpu
from gpuquota.core import ClusterState, decide, evolve, step
from gpuquota.native import loader as _native
from gpuquota.scheduler.loop import GC_THRESHOLDS
from gpuquota.wire import events as ev
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

UNITS = ("ml.g5.xlarge", "ml.g5.12xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g6.xlarge")
INSTANCES = 10_000
SLOTS_PER_NODE = 8
SHARES = 20
SIZES = (1, 1, 1, 2, 2, 4, 8)
PAYLOAD = json.dumps({"AlgorithmSpecification": {"ContainerEntrypoint": ["python", "train.py"]}})


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Driver:
    """Feeds inputs through decide + evolve and tracks what the workload generator needs."""

    rng: random.Random
    state: ClusterState = field(default_factory=lambda: ClusterState(heartbeat_timeout_ms=600_000))
    now: int = 1_700_000_000_000
    serial: int = 0
    dispatched: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    """job id -> (attempt id, first node id) of dispatched jobs."""
    dispatched_ids: list[str] = field(default_factory=list)
    stopping: set[str] = field(default_factory=set)
    queued: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def feed(self, message: Any) -> list[ev.SchedulerEvent]:
        events = decide(self.state, message)
        for event in events:
            evolve(self.state, event)
        for event in events:
            self.observe(event)
        return events

    def observe(self, event: ev.SchedulerEvent) -> None:
        name = type(event).__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        if isinstance(event, ev.JobDispatched):
            self.dispatched[event.job_id] = (event.attempt_id, [p.node_id for p in event.placements])
            self.dispatched_ids.append(event.job_id)
        elif isinstance(event, ev.JobPreempted | ev.JobStopRequested):
            self.stopping.add(event.job_id)
        elif isinstance(event, ev.JobSucceeded | ev.JobFailed | ev.JobRequeued):
            self.dispatched.pop(event.job_id, None)
            self.stopping.discard(event.job_id)

    def message(self, kind: type[Any], advance: bool = True, **fields: Any) -> Any:
        self.serial += 1
        self.now += 1 if advance else 0
        return kind(event_id=f"b{self.serial}", occurred_at=self.now, **fields)

    def job(self, index: int) -> JobSpec:
        rng = self.rng
        return JobSpec(
            job_id=f"job-{index}",
            job_name=f"job-{index}",
            job_queue="jq",
            quota_share=f"share-{rng.randrange(SHARES)}",
            priority=rng.randrange(10),
            unit=rng.choice(UNITS),
            count=rng.choice(SIZES),
            created_at=self.now,
            payload=PAYLOAD,
        )


def setup_cluster(driver: Driver) -> None:
    per_unit = INSTANCES // len(UNITS)
    limits = tuple(CapacityLimit(unit=u, max_capacity=per_unit) for u in UNITS)
    driver.feed(driver.message(inp.CreateSchedulingPolicy, spec=SchedulingPolicySpec(name="policy")))
    env = ServiceEnvironmentSpec(name="se", capacity_limits=limits)
    driver.feed(driver.message(inp.CreateServiceEnvironment, spec=env))
    queue = JobQueueSpec(name="jq", service_environment="se", scheduling_policy="policy")
    driver.feed(driver.message(inp.CreateJobQueue, spec=queue))
    share_limit = per_unit // SHARES
    for index in range(SHARES):
        strategies = (Strategy.RESERVE, Strategy.LEND, Strategy.LEND_AND_BORROW, Strategy.LEND_AND_BORROW)
        strategy = strategies[index % 4]
        borrow = (-1, 50, 200)[index % 3] if strategy is Strategy.LEND_AND_BORROW else -1
        spec = QuotaShareSpec(
            name=f"share-{index}",
            job_queue="jq",
            capacity_limits=tuple(CapacityLimit(unit=u, max_capacity=share_limit) for u in UNITS),
            strategy=strategy,
            borrow_limit=borrow,
            in_share_preemption=index % 2 == 0,
        )
        driver.feed(driver.message(inp.CreateQuotaShare, spec=spec))
    for unit_index, unit in enumerate(UNITS):
        for node in range(per_unit // SLOTS_PER_NODE):
            slots = tuple(SlotOffer(unit=unit, gpus=(g,)) for g in range(SLOTS_PER_NODE))
            driver.feed(driver.message(inp.RegisterNode, node_id=f"n{unit_index}-{node}", slots=slots))


def next_input(driver: Driver, serial: int) -> Any:
    """One input of the mixed workload."""
    rng = driver.rng
    roll = rng.random()
    if driver.stopping and roll < 0.5:
        return report(driver, min(driver.stopping), "STOPPED")
    if roll < 0.40 and driver.dispatched:
        return report(driver, pick_dispatched(driver), "SUCCEEDED")
    if roll < 0.78:
        return driver.message(inp.SubmitJob, job=driver.job(serial))
    if roll < 0.93:
        job_id = f"job-{rng.randrange(serial)}"
        return driver.message(inp.UpdateJobPriority, job_id=job_id, priority=rng.randrange(10))
    if roll < 0.98:
        node = f"n{rng.randrange(len(UNITS))}-{rng.randrange(INSTANCES // len(UNITS) // SLOTS_PER_NODE)}"
        return driver.message(inp.NodeHeartbeat, node_id=node)
    return driver.message(inp.Tick)


def report(driver: Driver, job_id: str, status: str) -> Any:
    """One node's final report; an attempt spread over several nodes ends with its last node's (I6)."""
    attempt_id, nodes = driver.dispatched[job_id]
    node_id = nodes.pop() if len(nodes) > 1 else nodes[0]
    return driver.message(
        inp.AttemptReport, node_id=node_id, job_id=job_id, attempt_id=attempt_id, status=status
    )


def pick_dispatched(driver: Driver) -> str:
    ids = driver.dispatched_ids
    while True:
        index = driver.rng.randrange(len(ids))
        job_id = ids[index]
        if job_id in driver.dispatched and job_id not in driver.stopping:
            return job_id
        ids[index] = ids[-1]
        ids.pop()
        if not ids:
            return min(driver.dispatched)


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def run(
    queued: int, inputs: int, seed: int, progress: bool, mode: str = "step", tune_gc: bool = True
) -> dict[str, Any]:
    driver = Driver(random.Random(seed))
    setup_cluster(driver)
    gc.collect()
    base_rss = rss_mb()
    started = time.perf_counter()
    for index in range(queued):
        # The queue is filled at one instant: simulated time must not outrun the nodes' heartbeats.
        driver.feed(driver.message(inp.SubmitJob, advance=False, job=driver.job(index)))
        if progress and index and index % 100_000 == 0:
            print(f"  queued {index:,} jobs ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    fill_seconds = time.perf_counter() - started
    gc.collect()
    thresholds = gc.get_threshold()
    if tune_gc:
        # As both shells do once they have loaded their state (gpuquota.entrypoints: embedded, distributed).
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
    gc_settings = f"thresholds {'/'.join(map(str, gc.get_threshold()))}, frozen after the fill: {tune_gc}"
    queued_now = sum(len(s.queue) for s in driver.state.shares.values())
    bytes_per_job = (rss_mb() - base_rss) * 2**20 / max(1, len(driver.state.jobs))
    latencies: list[float] = []
    driver.counts.clear()
    gc.collect()
    clock = time.perf_counter
    fused = mode == "step"
    host = HostCpu(calibrate=True).start()  # its calibration before the span, not in it
    started = clock()
    cpu_started = time.process_time()
    for serial in range(queued, queued + inputs):
        message = next_input(driver, serial)
        t0 = clock()
        if fused:
            events = step(driver.state, message)
        else:
            events = decide(driver.state, message)
            for event in events:
                evolve(driver.state, event)
        latencies.append(clock() - t0)
        for event in events:
            driver.observe(event)
        if progress and (serial - queued) and (serial - queued) % 50_000 == 0:
            print(f"  {serial - queued:,} inputs ({clock() - started:.0f} s)", file=sys.stderr)
    measured = sum(latencies)
    cpu_seconds = time.process_time() - cpu_started
    host.stop()
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    latencies.sort()
    return {
        "queued": queued,
        "inputs": inputs,
        "mode": mode,
        "instances": INSTANCES,
        "units": len(UNITS),
        "shares": SHARES,
        "inputs_per_s": round(inputs / measured, 1),
        "cpu_seconds_whole_loop": round(cpu_seconds, 2),
        **host.readings(),
        "latency_p50_ms": round(percentile(latencies, 0.50) * 1000, 4),
        "latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 4),
        "latency_max_ms": round(latencies[-1] * 1000, 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "bytes_per_queued_job": round(bytes_per_job),
        "queued_at_end": sum(len(s.queue) for s in driver.state.shares.values()),
        "queued_after_fill": queued_now,
        "fill_seconds": round(fill_seconds, 1),
        "events": dict(sorted(driver.counts.items())),
        "python": sys.version.split()[0],
        "core": _native.core_mode(),
        "gc": gc_settings,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.core", description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=100_000, help="jobs queued before measuring (N)")
    parser.add_argument("--inputs", type=int, default=200_000, help="mixed inputs measured (M)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--mode",
        choices=("step", "decide"),
        default="step",
        help="step: decide and apply in one go, as the shells do (default); decide: decide, then evolve",
    )
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="keep Python's collector settings (by default: the shells' thresholds, frozen after the fill)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.queued < 0 or args.inputs < 1:
        parser.error("--queued must be >= 0 and --inputs >= 1")
    progress = not args.json or sys.stderr.isatty()
    result = run(args.queued, args.inputs, args.seed, progress, args.mode, not args.default_gc)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
