"""The scheduling core: pure decisions over quota shares (semantics S1 to S8). No I/O here.

Entry points: ``decide(state, input) -> events`` and ``evolve(state, event) -> state``; ``step`` does
both at once for shells that rebuild from the log on a failed append;
``replay(events)`` folds a log; ``explain(state, job_id)`` says why a job waits.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuquota.core.decide import decide, step
from gpuquota.core.evolve import evolve
from gpuquota.core.explain import Explanation, explain
from gpuquota.core.policy import DEFAULT_POLICY, SchedulingPolicy
from gpuquota.core.state import ClusterState, fingerprint
from gpuquota.wire.events import SchedulerEvent


def replay(
    events: Iterable[SchedulerEvent], heartbeat_timeout_ms: int = DEFAULT_POLICY.heartbeat_timeout_ms
) -> ClusterState:
    """Fold a recorded log from the empty state."""
    state = ClusterState(heartbeat_timeout_ms)
    for event in events:
        evolve(state, event)
    return state


__all__ = [
    "DEFAULT_POLICY",
    "ClusterState",
    "Explanation",
    "SchedulingPolicy",
    "decide",
    "evolve",
    "explain",
    "fingerprint",
    "replay",
    "step",
]
