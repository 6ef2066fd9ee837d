"""The figures of each configuration's replay, side by side: per share and for the pool.

GPU-hours count capacity-unit instances (one ``ml.g5.xlarge`` for one hour is one hour), over the
replay's span: from the first submission to the end of the last job. Utilisation is the share's
usage over its limit's hours; idle is the part of its limit it did not use itself (whether lent or
not); for the pool, idle is capacity nobody used. Wait is from submission to the first dispatch.
"""

from __future__ import annotations

from typing import Any

from gpuquota.sim.engine import Result
from gpuquota.sim.stats import MS_PER_HOUR, ShareCounters, WaitSketch

POOL = "(pool)"


def _hours(ms: int | float) -> float:
    return round(ms / MS_PER_HOUR, 2)


def _wait(sketch: WaitSketch) -> dict[str, float]:
    return {
        "wait_p50_s": round(sketch.quantile(0.50), 1),
        "wait_p95_s": round(sketch.quantile(0.95), 1),
        "wait_max_s": round(sketch.max_seconds, 1),
    }


def _merged(counters: list[ShareCounters]) -> ShareCounters:
    pool = ShareCounters()
    for c in counters:
        for name in (
            "submitted",
            "rejected",
            "finished",
            "failed",
            "failed_by_preemption",
            "preemptions",
            "lost_ms",
        ):
            setattr(pool, name, getattr(pool, name) + getattr(c, name))
        pool.waits.total += c.waits.total
        pool.waits.max_seconds = max(pool.waits.max_seconds, c.waits.max_seconds)
        pool.waits.counts = [a + b for a, b in zip(pool.waits.counts, c.waits.counts, strict=True)]
    return pool


def _row(
    c: ShareCounters, limit: int, span_ms: int, used: int, in_quota: int, borrowed: int, lent: int
) -> dict[str, Any]:
    limit_ms = limit * span_ms
    return {
        "jobs_submitted": c.submitted,
        "jobs_finished": c.finished,
        "jobs_failed": c.failed,
        "jobs_rejected": c.rejected,
        **_wait(c.waits),
        "utilisation": round(used / limit_ms, 3) if limit_ms else 0.0,
        "gpu_hours_used": _hours(used),
        "gpu_hours_borrowed": _hours(borrowed),
        "gpu_hours_lent": _hours(lent),
        "gpu_hours_idle": _hours(max(0, limit_ms - in_quota)),
        "preemptions": c.preemptions,
        "preempted_gpu_hours": _hours(c.lost_ms),
        "failed_by_preemption_retries": c.failed_by_preemption,
    }


def summary(result: Result) -> dict[str, Any]:
    span = result.end_ms - result.start_ms
    shares: dict[str, Any] = {}
    for i, name in enumerate(result.shares):
        shares[name] = _row(
            result.counters[i],
            result.limits[i],
            span,
            result.used_ms[i],
            result.in_quota_ms[i],
            result.borrowed_ms[i],
            result.lent_ms[i],
        )
    used = sum(result.used_ms)
    pool = _row(
        _merged(result.counters),
        result.capacity,
        span,
        used,
        used,
        sum(result.borrowed_ms),
        sum(result.lent_ms),
    )
    pool["jobs_submitted"] += result.unmatched
    pool["jobs_rejected"] += result.unmatched
    shares[POOL] = pool
    return {
        "configuration": result.name,
        "simulated_hours": _hours(span),
        "inputs": result.inputs,
        "events": result.events,
        "wall_seconds": round(result.wall_seconds, 2),
        "shares": shares,
        "training_plans": {
            p["trainingPlanName"]: {
                "count": p["count"],
                "windows": len(p["windows"]),
                "gpu_hours_used": p["usedGpuHours"],
                "gpu_hours_idle": p["idleGpuHours"],
            }
            for p in result.plans
        },
    }


def as_json(results: list[Result]) -> dict[str, Any]:
    return {"configurations": [summary(r) for r in results]}


LABELS = {
    "jobs_finished": "jobs finished",
    "jobs_rejected": "jobs rejected",
    "jobs_failed": "jobs failed",
    "wait_p50_s": "wait p50 (s)",
    "wait_p95_s": "wait p95 (s)",
    "wait_max_s": "wait max (s)",
    "utilisation": "utilisation of limit",
    "gpu_hours_used": "GPU-hours used",
    "gpu_hours_borrowed": "GPU-hours borrowed",
    "gpu_hours_lent": "GPU-hours lent",
    "gpu_hours_idle": "GPU-hours idle",
    "preemptions": "preemptions",
    "preempted_gpu_hours": "preempted GPU-hours",
    "failed_by_preemption_retries": "failed by preemption retries",
}


PLAN_LABELS = {
    "count": "plan instances",
    "windows": "plan windows",
    "gpu_hours_used": "plan GPU-hours used",
    "gpu_hours_idle": "plan GPU-hours idle",
}
"""A training plan's block (S11): its capacity in its windows, used by any share, or idle."""


def table(results: list[Result]) -> str:
    """One block per share (and the pool), one column per configuration."""
    summaries = [summary(r) for r in results]
    names = [s["configuration"] for s in summaries]
    share_names: list[str] = []
    for s in summaries:
        share_names += [n for n in s["shares"] if n not in share_names and n != POOL]
    share_names.append(POOL)
    plan_heads = [f"plan {name}" for s in summaries for name in s["training_plans"]]
    share_width = max(len("share"), *map(len, share_names), *map(len, plan_heads))
    label_width = max(map(len, LABELS.values()))
    widths = [max(12, len(n)) for n in names]
    header = f"{'share':<{share_width}}  {'metric':<{label_width}}"
    lines = [header + "".join(f"  {n:>{w}}" for n, w in zip(names, widths, strict=True))]
    for share in share_names:
        for key, label in LABELS.items():
            head = share if key == "jobs_finished" else ""
            cells = "".join(
                f"  {s['shares'].get(share, {}).get(key, '-'):>{w}}"
                for s, w in zip(summaries, widths, strict=True)
            )
            lines.append(f"{head:<{share_width}}  {label:<{label_width}}{cells}")
        lines.append("")
    plan_names = sorted({name for s in summaries for name in s["training_plans"]})
    for plan in plan_names:
        for key, label in PLAN_LABELS.items():
            head = f"plan {plan}" if key == "count" else ""
            cells = "".join(
                f"  {s['training_plans'].get(plan, {}).get(key, '-'):>{w}}"
                for s, w in zip(summaries, widths, strict=True)
            )
            lines.append(f"{head:<{share_width}}  {label:<{label_width}}{cells}")
        lines.append("")
    spans = ", ".join(
        f"{s['configuration']}: {s['simulated_hours']} h simulated in {s['wall_seconds']} s"
        for s in summaries
    )
    lines.append(spans)
    return "\n".join(lines)
