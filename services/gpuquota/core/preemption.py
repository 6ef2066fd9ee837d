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
import itertools
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from gpuquota.core.quota import Figures, Ledger, share_limit, usable_slots
from gpuquota.core.state import JobRecord, ShareKey, VictimKey

Eligible = Callable[[JobRecord, dict[ShareKey, int]], bool]


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
            s.key: (share_limit(s, head.unit), ledger.share_usage(s, head.unit, head.job_id))
            for s in ledger.reserve_shares
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
    ledger: Ledger, head: JobRecord, candidates: Iterable[VictimKey], eligible: Eligible
) -> list[JobRecord] | None:
    """The victims that let ``head`` fit; ``None`` when no set of them suffices.

    ``candidates`` arrive in victim order (``JobRecord.victim_key``) and are read lazily: the
    search usually stops after a few of them.
    """
    candidates = iter(candidates)
    first = next(candidates, None)
    if first is None:
        return None
    share = ledger.state.shares[head.share]
    sim = Simulation(ledger, head, ledger.figures(share, head.unit, head.count, exclude=head.job_id))
    jobs = ledger.state.jobs
    chosen: list[JobRecord] = []
    fitted = False
    for key in itertools.chain((first,), candidates):
        victim = jobs[key[2]]
        if not eligible(victim, sim.removed):
            continue
        chosen.append(victim)
        sim.remove(victim)
        if sim.fits():
            fitted = True
            break
    if not fitted:
        return None
    for victim in reversed(list(chosen)):
        sim.remove(victim, sign=-1)
        if sim.fits():
            chosen.remove(victim)
        else:
            sim.remove(victim)
    return chosen


def cross_share_candidates(ledger: Ledger, head: JobRecord) -> tuple[Iterator[VictimKey], Eligible]:
    """S4.1: dispatched, not-yet-stopping jobs of *other* shares that borrow ``head``'s unit.

    Borrowing is S2.6's ``U > L`` with S2.2's ``U``: the instances the share's jobs hold. A hold the share
    has for its own waiting head (S4.3) is not usage yet: counted, it made a share at its limit look
    borrowing, and a reclaim preempted a job it did not owe (found by the S7.5 property test)."""
    state, unit = ledger.state, head.unit
    borrowing = {}
    for s in ledger.shares:
        usage, limit = s.usage.get(unit, 0), share_limit(s, unit)
        if s.key != head.share and usage > limit:
            borrowing[s.key] = (usage, limit)
    queues: list[Iterable[VictimKey]] = [state.shares[key].victims.get(unit, ()) for key in borrowing]

    def still_borrowing(victim: JobRecord, removed: dict[ShareKey, int]) -> bool:
        usage, limit = borrowing[victim.share]
        return usage - removed.get(victim.share, 0) > limit

    return iter(heapq.merge(*queues)), still_borrowing


def in_share_candidates(ledger: Ledger, head: JobRecord) -> tuple[Iterator[VictimKey], Eligible]:
    """S4.2: dispatched, not-yet-stopping jobs of the head's own share with strictly lower priority."""
    victims = ledger.state.shares[head.share].victims.get(head.unit)
    # Most heads have no lower-priority victim at all (victims[0] has the lowest priority): answer
    # that without building a range iterator, since the in-share phase asks for every waiting head.
    if not victims or victims[0][0] >= head.priority:
        return iter(()), _always
    lower = bisect_left(victims, (head.priority, -(2**62), ""))
    return itertools.islice(victims, lower), _always


def _always(victim: JobRecord, removed: dict[ShareKey, int]) -> bool:
    return True
