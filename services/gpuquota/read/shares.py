"""``gpuquota shares`` rows from the read model: per share its limits, usage, borrowed and lent
instances per unit and its queued jobs (the gateway's ``/gpuquota/v1/shares``, the console and the
share metrics read the same rows).

``borrowed`` and ``lent`` are display figures, not decision inputs: the core decides with
``gpuquota.core.quota``'s figures, from which ``lent`` also comes (``attribute_lent``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuquota.core.hygiene import MIN_RUNTIME_TAG, REBORROW_BACKOFF_TAG
from gpuquota.core.quota import attribute_lent, max_usage
from gpuquota.wire.base import QuotaShareSpec, Strategy

if TYPE_CHECKING:
    from gpuquota.read.jobs import ShareKey
    from gpuquota.read.model import ReadModel, ResourceView

HYGIENE_TAGS = (MIN_RUNTIME_TAG, REBORROW_BACKOFF_TAG)
"""S10's opt-in tags, shown with each share by ``gpuquota shares``."""


def share_usage(rm: ReadModel, queue: str, share: str) -> dict[str, int]:
    return {u: n for u, n in sorted(rm.usage.get((queue, share), {}).items()) if n}


def share_table(rm: ReadModel, queue: str | None = None) -> list[dict[str, Any]]:
    """One row per share (of ``queue``, or of every queue): limits, strategy, usage, borrowed and lent
    instances per unit and queued jobs (``gpuquota shares``).

    ``borrowed`` is ``max(0, U - L)``. ``lent`` attributes the queue's borrowed instances that the
    service environment's capacity not covered by any share cannot explain to the idle capacity of
    LEND and LEND_AND_BORROW shares, in share-name order: a display figure, not a decision input.
    """
    rows = []
    lent = _lent(rm)
    for (queue_name, name), view in sorted(rm.shares.items()):
        if queue is not None and queue_name != queue:
            continue
        spec = view.spec
        limits = {c.unit: c.max_capacity for c in spec.capacity_limits}
        usage = share_usage(rm, queue_name, name)
        borrowed = {u: n - limits.get(u, 0) for u, n in usage.items() if n > limits.get(u, 0)}
        rows.append(
            {
                "jobQueue": queue_name,
                "quotaShareName": name,
                "strategy": spec.strategy.value,
                "borrowLimit": spec.borrow_limit if spec.strategy is Strategy.LEND_AND_BORROW else None,
                "inSharePreemption": "ENABLED" if spec.in_share_preemption else "DISABLED",
                "limits": limits,
                "maximum": {u: max_usage(spec, spec.limit(u)) for u in sorted(set(limits) | set(usage))},
                "usage": usage,
                "borrowed": borrowed,
                "lent": lent.get((queue_name, name), {}),
                "runnable": len(rm.runnable.get((queue_name, name), ())),
                "state": spec.state.value,
                "status": view.status,
                "hygiene": {t: v for t, v in spec.tags.items() if t in HYGIENE_TAGS},
            }
        )
    return rows


def share_maximum(rm: ReadModel, queue: str, share: str, unit: str) -> int | None:
    """M(s,u) of S2.3, asked of the core (``gpuquota.core.quota.max_usage``); ``None``: unbounded."""
    spec = rm.shares[(queue, share)].spec
    return max_usage(spec, spec.limit(unit))


def _lent(rm: ReadModel) -> dict[ShareKey, dict[str, int]]:
    by_queue: dict[str, list[ResourceView[QuotaShareSpec]]] = {}
    for (queue_name, _), view in sorted(rm.shares.items()):
        by_queue.setdefault(queue_name, []).append(view)
    out: dict[ShareKey, dict[str, int]] = {}
    for queue_name, views in by_queue.items():
        queue = rm.queues.get(queue_name)
        environment = None if queue is None else rm.environments.get(queue.spec.service_environment)
        capacity = (
            {} if environment is None else {c.unit: c.max_capacity for c in environment.spec.capacity_limits}
        )
        for unit, total in capacity.items():
            limits = [
                next((c.max_capacity for c in view.spec.capacity_limits if c.unit == unit), 0)
                for view in views
            ]
            used = [rm.usage.get((queue_name, view.spec.name), {}).get(unit, 0) for view in views]
            lends = [view.spec.strategy is not Strategy.RESERVE for view in views]
            for index, given in attribute_lent(total, limits, used, lends).items():
                out.setdefault((queue_name, views[index].spec.name), {})[unit] = given
    return out
