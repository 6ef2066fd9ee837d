"""gpuquota's extensions of the API (not AWS): ``gpuquota shares`` and ``gpuquota explain``.

- ``GET /gpuquota/v1/shares?queue=Q``: per share its strategy, limits, usage, borrowed, lent and queued
  jobs (of one queue or all).
- ``GET /gpuquota/v1/jobs/{job}/explain``: why a job waits or was preempted: the core's explanation
  (embedded mode, where the gateway sees the core's state) plus the read model's preemptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuquota.core.explain import Explanation
from gpuquota.gateway.context import Context
from gpuquota.gateway.render import camel, job_brief
from gpuquota.read.shares import share_table

Explainer = Callable[[str], Explanation | None]
"""``gpuquota.core.explain.explain`` bound to the scheduler's state (embedded mode)."""


def share_table_of(gw: Context, queue_ref: str | None) -> dict[str, Any]:
    queue = None if not queue_ref else gw.queue(queue_ref).spec.name
    return {"quotaShares": share_table(gw.rm, queue)}


def explain(gw: Context, explainer: Explainer | None, ref: str) -> dict[str, Any]:
    job = gw.job(ref)
    out: dict[str, Any] = {
        **job_brief(job),
        "demand": {"capacityUnit": job.unit, "quantity": job.count},
        "preemptedAttemptCount": job.preempted_count,
        "explanation": None,
        "lastPreemption": job.preemptions[0] if job.preemptions else None,
        "preemptions": list(job.preemptions),
        "history": [{"at": at, "status": status} for at, status in job.history],
        "outputs": list(job.attempts[-1].outputs) if job.attempts else [],
    }
    found = None if explainer is None or job.terminal else explainer(job.job_id)
    if found is not None:
        head = None if found.share_head is None else gw.rm.jobs.get(found.share_head)
        out["explanation"] = {
            "reason": found.reason,
            "message": found.message,
            "action": found.action,
            "position": found.position,
            "shareHead": found.share_head,
            "shareHeadName": None if head is None else head.job_name,
            "figures": {camel(k): v for k, v in found.figures.items()},
            "startEstimate": found.estimate,
            "until": found.until,
        }
    return out
