"""Benchmark of ``gpuquota apply --dry-run``'s impact: ``python -m benchmarks.impact --queued N --json``.

The start estimate's cluster (``benchmarks.estimate``: a full 1,000-instance pool in 20 shares, N
jobs queued), and a change that halves the limit of every LEND_AND_BORROW share. Times what the
gateway does for ``POST /gpuquota/v1/impact``: the copy of the state (``copy_s``, a pickle, on the
state's thread) and ``gpuquota.sim.impact.impact`` on it (``impact_s``: two forward runs, in a worker
thread), with what it found (``preempted_now``, ``becomes_borrowing``, ``start_changes``) and whether
both runs finished within their budget (``complete``).
"""

from __future__ import annotations

import argparse
import pickle
import time
from typing import Any

from benchmarks.estimate import build
from benchmarks.report import print_result
from gpuquota.native import loader as _native
from gpuquota.sim.background import pickled
from gpuquota.sim.estimate import likely_end, observed_medians
from gpuquota.sim.impact import impact
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import CapacityLimit, Strategy


def run(queued: int, seed: int) -> dict[str, Any]:
    cluster = build(queued, seed)
    now = cluster.now + 1
    changes = [
        inp.UpdateQuotaShare(
            event_id=f"dry-{index}",
            occurred_at=now,
            spec=share.spec.model_copy(
                update={
                    "capacity_limits": tuple(
                        CapacityLimit(unit=c.unit, max_capacity=max(1, c.max_capacity // 2))
                        for c in share.spec.capacity_limits
                    )
                }
            ),
        )
        for index, share in enumerate(cluster.state.shares.values())
        if share.spec.strategy is Strategy.LEND_AND_BORROW
    ]
    started = time.perf_counter()
    copy = pickled(cluster.state)
    copy_s = time.perf_counter() - started
    state = pickle.loads(copy)
    end_of = likely_end(observed_medians(cluster.read_model))
    started = time.perf_counter()
    found = impact(state, changes, now, end_of).as_json()
    impact_s = time.perf_counter() - started
    return {
        "core": _native.core_mode(),
        "queued": sum(len(s.queue) for s in cluster.state.shares.values()),
        "changed_shares": len(changes),
        "copy_s": round(copy_s, 3),
        "impact_s": round(impact_s, 3),
        "complete": found["complete"],
        "preempted_now": len(found["preempted_now"]),
        "becomes_borrowing": len(found["becomes_borrowing"]),
        "start_changes": len(found["start_changes"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.impact", description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000, help="jobs queued (N)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    print_result(run(args.queued, args.seed), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
