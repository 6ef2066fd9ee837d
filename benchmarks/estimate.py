"""Benchmark of ``gpuquota explain``'s start estimate: ``python -m benchmarks.estimate --queued N --json``.

A 1,000-instance pool (one unit) in 20 quota shares of mixed strategies, full (1,000 jobs running,
started at different times), N jobs queued across the shares, and the median durations of 500
finished jobs. Times the estimate (``gpuquota.sim.estimate.estimate``, what the gateway's explain adds)
of the head of a share's queue, of a job halfway down one, and of the last queued job of the pool.
The estimate has a time budget (``gpuquota.sim.estimate.BUDGET_S``): ``*_finished_in_budget`` says
whether it found the start within it; if not, ``*_likely_wait_s`` is how far it got (a lower bound).
``first_*``, ``background_sweeps_s``, ``sample_*``: as the gateway estimates (``BackgroundEstimator``),
the deepest job is asked first (its answer waits at most the budget while the sweeps start on a copy
in a thread); once the sweeps are done, 100 jobs picked evenly over every depth of the share queues;
``sample_answered`` counts those with a likely start.
``kept_*``, ``new_job_*``: what a user of a gateway that keeps its sweeps ahead sees (``EstimatingExplainer
.keep_ahead``, once an estimate has been asked for): a job ends (a new state version, which starts
a new run), then the deepest job is asked first: ``kept_first_ms``, ``kept_first_complete`` (a likely
start and a finished latest sweep, from the newest finished run), ``kept_first_assumed`` (how old it
says it is). Then a job is submitted at the end of the deepest queue and asked about at once
(``new_job_ms``, ``new_job_complete``: no finished run knows it yet) and again, as the refresh task
does, until complete (``new_job_complete_after_s``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from benchmarks.report import print_result
from gpuquota.core import ClusterState, step
from gpuquota.native import loader as _native
from gpuquota.read.model import ReadModel
from gpuquota.sim.background import BackgroundEstimator
from gpuquota.sim.config import Configuration
from gpuquota.sim.estimate import estimate
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    CapacityLimit,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    Strategy,
)

UNIT = "ml.p5.48xlarge"
POOL = 1_000
SHARES = 20
FINISHED = 500
SAMPLE = 100
STRATEGIES = (Strategy.RESERVE, Strategy.LEND, Strategy.LEND_AND_BORROW, Strategy.LEND_AND_BORROW)


def configuration() -> Configuration:
    shares = tuple(
        QuotaShareSpec(
            name=f"share-{i:02d}",
            job_queue="jq",
            capacity_limits=(CapacityLimit(unit=UNIT, max_capacity=POOL // SHARES),),
            strategy=STRATEGIES[i % 4],
            in_share_preemption=i % 2 == 0,
        )
        for i in range(SHARES)
    )
    return Configuration(
        "benchmark",
        SchedulingPolicySpec(name="policy"),
        ServiceEnvironmentSpec(name="se", capacity_limits=(CapacityLimit(unit=UNIT, max_capacity=POOL),)),
        JobQueueSpec(name="jq", service_environment="se", scheduling_policy="policy"),
        shares,
    )


class Cluster:
    def __init__(self) -> None:
        self.state = ClusterState(10**12)
        self.read_model = ReadModel()
        self.serial = 0
        self.now = 0

    def feed(self, kind: type[Any], **fields: Any) -> None:
        self.serial += 1
        for event in step(self.state, kind(event_id=f"i{self.serial}", occurred_at=self.now, **fields)):
            self.read_model.apply(event)


def build(queued: int, seed: int) -> Cluster:
    rng = random.Random(seed)
    cluster = Cluster()
    for kind, fields in configuration().setup():
        cluster.feed(kind, **fields)
    for index in range(POOL + FINISHED + queued):
        cluster.now += rng.randrange(200)
        job = JobSpec(
            job_id=f"job-{index}",
            job_name=f"job-{index}",
            job_queue="jq",
            quota_share=f"share-{rng.randrange(SHARES):02d}",
            priority=rng.randrange(3),
            unit=UNIT,
            count=rng.choice((1, 1, 1, 2, 4)),
            created_at=cluster.now,
        )
        cluster.feed(inp.SubmitJob, job=job)
        if index >= POOL and index < POOL + FINISHED:
            finish_one(cluster, rng)
    return cluster


def finish_one(cluster: Cluster, rng: random.Random) -> None:
    running = [j for j in cluster.state.jobs.values() if j.attempt_id is not None]
    job = rng.choice(running)
    assert job.attempt_id is not None
    cluster.feed(
        inp.AttemptReport,
        node_id=job.placements[0].node_id,
        job_id=job.job_id,
        attempt_id=job.attempt_id,
        status="SUCCEEDED",
    )


def targets(state: ClusterState) -> dict[str, str]:
    share = max(state.shares.values(), key=lambda s: len(s.queue))
    queue = list(share.queue)
    last = max((key for s in state.shares.values() for key in s.queue), key=lambda k: (k[1], k[2]))
    return {"head": queue[0][2], "middle": queue[len(queue) // 2][2], "last_submitted": last[2]}


def run(queued: int, seed: int, repeat: int) -> dict[str, Any]:
    cluster = build(queued, seed)
    state = cluster.state
    result: dict[str, Any] = {
        "queued": sum(len(s.queue) for s in state.shares.values()),
        "running": sum(1 for j in state.jobs.values() if j.attempt_id is not None),
    }
    now = cluster.now + 1
    for label, job_id in targets(state).items():
        timings = []
        found = None
        for _ in range(repeat):
            started = time.perf_counter()
            found = estimate(state, cluster.read_model, job_id, now)
            timings.append(time.perf_counter() - started)
        assert found is not None
        result[f"{label}_ms"] = round(statistics.median(timings) * 1000, 1)
        likely = found["likelyStartAt"]
        reached = found["likelyNotBefore"]
        result[f"{label}_finished_in_budget"] = likely is not None
        result[f"{label}_likely_wait_s"] = round(((likely if likely is not None else reached) - now) / 1000)
    estimator, sample = sampled(cluster, now)
    result.update(sample)
    result.update(kept_ahead(cluster, estimator, now, random.Random(seed + 1)))
    result["core"] = _native.core_mode()
    return result


def sampled(cluster: Cluster, now: int, size: int = SAMPLE) -> tuple[BackgroundEstimator, dict[str, Any]]:
    """Estimates of ``size`` jobs spread over every depth of every share's queue, as the gateway's
    explainer makes them (``BackgroundEstimator``): the first asks for the deepest job and starts the
    sweeps on a copy; once they are done, every estimate is a look-up."""
    queues = [list(share.queue) for share in cluster.state.shares.values() if share.queue]
    depths = sorted(((i, key[2]) for queue in queues for i, key in enumerate(queue)), key=lambda d: d[0])
    picks = [depths[round(k * (len(depths) - 1) / max(1, size - 1))] for k in range(size)]
    estimator = BackgroundEstimator()
    started = time.perf_counter()
    first = estimator.estimate(cluster.state, cluster.read_model, picks[-1][1], now)
    first_ms = (time.perf_counter() - started) * 1000
    run = estimator.current
    assert run is not None and first is not None
    while not run.over:
        time.sleep(0.05)
    swept_s = time.perf_counter() - started
    timings, answered = [], 0
    for _, job_id in picks:
        started = time.perf_counter()
        found = estimator.estimate(cluster.state, cluster.read_model, job_id, now)
        timings.append((time.perf_counter() - started) * 1000)
        answered += found is not None and found["likelyStartAt"] is not None
    ordered = sorted(timings)
    return estimator, {
        "first_ms": round(first_ms, 1),
        "first_answered": first["likelyStartAt"] is not None,
        "background_sweeps_s": round(swept_s, 2),
        "sample_jobs": len(picks),
        "sample_max_depth": picks[-1][0],
        "sample_p50_ms": round(ordered[len(ordered) // 2], 3),
        "sample_p99_ms": round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 3),
        "sample_max_ms": round(ordered[-1], 3),
        "sample_answered": answered,
    }


def complete(found: dict[str, Any] | None) -> bool:
    """A likely start, and a latest one or none (no bound) from a finished sweep."""
    return found is not None and found["likelyStartAt"] is not None and found["latestNotBefore"] is None


def kept_ahead(
    cluster: Cluster, estimator: BackgroundEstimator, now: int, rng: random.Random
) -> dict[str, Any]:
    """A state change, the refresh the gateway's task makes, then the deepest job asked first; then a
    newly submitted job, asked until its estimate is complete."""
    state, read_model = cluster.state, cluster.read_model
    deepest = max((list(s.queue) for s in state.shares.values()), key=len)[-1][2]
    cluster.now = now
    finish_one(cluster, rng)
    now += 1
    estimator.refresh(state, read_model, now)
    started = time.perf_counter()
    first = estimator.estimate(state, read_model, deepest, now)
    kept_ms = (time.perf_counter() - started) * 1000
    assert first is not None
    share = max(state.shares.values(), key=lambda s: len(s.queue))
    job = JobSpec(
        job_id="job-new",
        job_name="job-new",
        job_queue="jq",
        quota_share=share.spec.name,
        unit=UNIT,
        created_at=cluster.now,
    )
    cluster.feed(inp.SubmitJob, job=job)
    submitted = time.perf_counter()
    estimator.refresh(state, read_model, now)
    new = estimator.estimate(state, read_model, "job-new", now)
    new_ms = (time.perf_counter() - submitted) * 1000
    later = new
    while not complete(later) and time.perf_counter() - submitted < 60:
        time.sleep(0.05)
        estimator.refresh(state, read_model, now)
        later = estimator.estimate(state, read_model, "job-new", now)
    return {
        "kept_first_ms": round(kept_ms, 2),
        "kept_first_complete": complete(first),
        "kept_first_assumed": first["assumptions"][-1],
        "new_job_ms": round(new_ms, 1),
        "new_job_complete": complete(new),
        "new_job_complete_after_s": round(time.perf_counter() - submitted, 2) if complete(later) else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.estimate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--queued", type=int, default=10_000, help="jobs queued (N)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=5, help="estimates per target (the median is printed)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    print_result(run(args.queued, args.seed, args.repeat), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
