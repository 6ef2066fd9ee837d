"""Preemption search (semantics S4.1 and S4.2): which dispatched jobs must stop so a head can run.

Theory of operation
-------------------
Given a RUNNABLE head ``j`` that does not fit and a list of candidate victims, the search works on
*simulated* figures; it never touches the state:

1. Order candidates by ``victim_key``: lower priority first, then most recently dispatched, then job
   id (the last key makes the order total, so the search is deterministic).
2. Remove candidates in that order, skipping one whose eligibility rule says no at that point of the
   search (cross-share: its share must still be borrowing after the removals so far), until ``j``
   fits. If ``j`` does not fit with every eligible candidate removed, preempt nothing (no pointless
   preemption).
3. Put back, newest removal first, every victim that ``j`` does not need: if ``j`` still fits with it
   back, it is not a victim.

"Fits" is the admission constraint of ``quota`` evaluated with the victims' usage subtracted: the
preemptor's share maximum, ``sum U + R + k <= C`` (``R`` recomputed, since removing a job of a RESERVE
share changes its idle reserve) and ``k`` free slots, counting only slots on usable nodes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from gpuquota.core.quota import Figures, Ledger, share_limit, share_usage, usable_slots
from gpuquota.core.state import JobRecord, ShareKey
from gpuquota.wire.base import Strategy

VictimKey = tuple[int, int, str]
Eligible = Callable[[JobRecord, dict[ShareKey, int]], bool]


def victim_key(job: JobRecord) -> VictimKey:
    """S4.1 victim order: lower priority, then most recently dispatched, then job id."""
    return (job.priority, -job.dispatch_seq, job.job_id)


class Simulation:
    """The head's figures with some victims removed."""

    def __init__(self, ledger: Ledger, head: JobRecord, base: Figures) -> None:
        state = ledger.state
        self.state = state
        self.head = head
        self.base = base
        self.removed: dict[ShareKey, int] = {}
        self.removed_total = 0
        self.freed_slots = 0
        self.reserve_usage = {
            s.key: (share_limit(s, head.unit), share_usage(state, s, head.unit, head.job_id))
            for s in ledger.shares
            if s.spec.strategy is Strategy.RESERVE
        }

    def remove(self, victim: JobRecord, sign: int = 1) -> None:
        self.removed[victim.share] = self.removed.get(victim.share, 0) + sign * victim.count
        self.removed_total += sign * victim.count
        self.freed_slots += sign * usable_slots(self.state, victim)

    def fits(self) -> bool:
        base, k = self.base, self.head.count
        share_usage_now = base.share_usage - self.removed.get(self.head.share, 0)
        if base.share_max is not None and share_usage_now + k > base.share_max:
            return False
        # R of the *other* RESERVE shares: the head's own share's reserve is its own (S2.4).
        reserved = sum(
            max(0, limit - (usage - self.removed.get(key, 0)))
            for key, (limit, usage) in self.reserve_usage.items()
            if key != self.head.share
        )
        return (
            base.environment_enabled
            and base.usage - self.removed_total + reserved + k <= base.capacity
            and base.free_slots + self.freed_slots >= k
        )


def find_victims(
    ledger: Ledger, head: JobRecord, candidates: list[JobRecord], eligible: Eligible
) -> list[JobRecord] | None:
    """The victims that let ``head`` fit, in victim order; ``None`` when no set of them suffices."""
    if not candidates:
        return None
    share = ledger.state.shares[head.share]
    sim = Simulation(ledger, head, ledger.figures(share, head.unit, head.count, exclude=head.job_id))
    heap = [(victim_key(job), job.job_id) for job in candidates]
    heapq.heapify(heap)
    jobs = ledger.state.jobs
    chosen: list[JobRecord] = []
    fitted = False
    while heap and not fitted:
        victim = jobs[heapq.heappop(heap)[1]]
        if not eligible(victim, sim.removed):
            continue
        chosen.append(victim)
        sim.remove(victim)
        fitted = sim.fits()
    if not fitted:
        return None
    for victim in reversed(list(chosen)):
        sim.remove(victim, sign=-1)
        if sim.fits():
            chosen.remove(victim)
        else:
            sim.remove(victim)
    return chosen


def cross_share_candidates(ledger: Ledger, head: JobRecord) -> tuple[list[JobRecord], Eligible]:
    """S4.1: dispatched, not-yet-stopping jobs of *other* shares that borrow ``head``'s unit."""
    state, unit = ledger.state, head.unit
    borrowing = {
        s.key: (share_usage(state, s, unit), share_limit(s, unit))
        for s in ledger.shares
        if s.key != head.share and share_usage(state, s, unit) > share_limit(s, unit)
    }
    candidates = [
        state.jobs[job_id]
        for key in borrowing
        for job_id in state.shares[key].dispatched.get(unit, ())
        if state.jobs[job_id].stop is None
    ]

    def still_borrowing(victim: JobRecord, removed: dict[ShareKey, int]) -> bool:
        usage, limit = borrowing[victim.share]
        return usage - removed.get(victim.share, 0) > limit

    return candidates, still_borrowing


def in_share_candidates(ledger: Ledger, head: JobRecord) -> tuple[list[JobRecord], Eligible]:
    """S4.2: dispatched, not-yet-stopping jobs of the head's own share with strictly lower priority."""
    state = ledger.state
    share = state.shares[head.share]
    candidates = [
        state.jobs[job_id]
        for job_id in share.dispatched.get(head.unit, ())
        if state.jobs[job_id].priority < head.priority and state.jobs[job_id].stop is None
    ]
    return candidates, lambda victim, removed: True
