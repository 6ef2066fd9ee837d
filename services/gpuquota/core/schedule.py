"""The scheduling pass (semantics S3.3): after an input, dispatch what fits and preempt what must stop.

Theory of operation
-------------------
A pass runs per service environment, environments in the order of their job queue's priority (S1).
It is a sequence of numbered phases; each dispatch or preemption is emitted (and so applied to the
state under trial) at once, so later phases see earlier decisions.

0. Holds (S4.3). A preemptor whose victims have all stopped is dispatched if it fits; if it still does
   not fit, its hold is released and it competes normally. Holds whose victims are still stopping
   stay; the held capacity counts as used by everyone else.
1. In-quota phase. Heads that fit their share's own limit, oldest head first (``createdAt``, then job
   id), are dispatched while they fit; a dispatched head's successor joins the sweep if it is in quota
   too. A head that does not fit is *blocked*: capacity only shrinks during a pass, so it cannot fit
   later in the same pass.
2. Borrow phase (FIFO idle assignment). Heads of LEND_AND_BORROW shares that are over their own limit,
   oldest first, take idle capacity within their share maximum.
3. Reclaim phase (S4.1). Blocked in-quota heads, oldest first, reclaim capacity from borrowing shares.
4. In-share phase (S4.2). Heads that still wait, in shares with in-share preemption, preempt strictly
   lower-priority jobs of their own share. A job stopped here leaves the victim lists, which can let a
   phase-3 search succeed that failed (S4.1 skips victims whose share stops borrowing): phase 3 runs
   again for the heads still waiting, then phase 4, until phase 4 stops nothing.
5. Blocked heads (S9.1). Every share's head that can never run as things are is recorded with its
   reason (``gpuquota.core.blocked``), and a head that no longer is, cleared.

Without backfill (the default) only heads are ever considered (S3.2). With the policy's ``backfill``
extension, a blocked head lets up to ``BACKFILL_SCAN`` later jobs of its share try the same phase.

The pass is a fixpoint: running it twice in a row decides nothing the second time. ``decide`` relies
on this to skip the pass after inputs that cannot change any decision.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator

from gpuquota.core.blocked import record_blocked
from gpuquota.core.checkpoints import gpus_held, lost_ms, victim_order
from gpuquota.core.context import Context, DispatchPhase
from gpuquota.core.hygiene import borrow_blocked_until, protected_until
from gpuquota.core.plans import off_limits
from gpuquota.core.preemption import Eligible, cross_share_candidates, find_victims, in_share_candidates
from gpuquota.core.quota import Ledger
from gpuquota.core.state import LEND_AND_BORROW, JobRecord, ShareKey, ShareRecord
from gpuquota.wire import events as ev
from gpuquota.wire.base import Placement, ServiceEnvironmentSpec
from gpuquota.wire.fast_construct import fast_construct

BACKFILL_SCAN = 64


def schedule(ctx: Context) -> None:
    """Run one pass over every service environment."""
    for environment in environments_in_order(ctx):
        EnvironmentPass(ctx, environment).run()


def environments_in_order(ctx: Context) -> list[ServiceEnvironmentSpec]:
    """S1: environments sharing a pool are served in the order of their job queues' priority."""
    state = ctx.state

    key = ("environments-in-order", "")
    environments: list[ServiceEnvironmentSpec] | None = state.cached(key)
    if environments is None:
        ranked = []
        for queue in state.queues.values():
            environment = state.environments.get(queue.service_environment)
            if environment is not None:
                ranked.append((-queue.priority, environment.name, environment))
        ordered = [environment for _, _, environment in sorted(ranked, key=lambda r: (r[0], r[1]))]
        environments = state.cache(key, ordered)
    return environments


class EnvironmentPass:
    def __init__(self, ctx: Context, environment: ServiceEnvironmentSpec) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.environment = environment
        self.ledger = Ledger(ctx.state, environment)
        setup: tuple[list[ShareRecord], bool] | None = ctx.state.cached(("pass", environment.name))
        if setup is None:
            setup = ctx.state.cache(("pass", environment.name), self._setup())
        self.shares: list[ShareRecord] = setup[0]
        self.backfill: bool = setup[1]
        # Only heads of units the input touched can change (units are independent); backfill looks
        # past heads, so it revisits every unit.
        self.units: set[str] | None = None if self.backfill else ctx.dirty  # live: grows as heads change
        self.revisit = False
        self.scoped = [s for s in self.shares if s.head_since is not None and self.in_scope_share(s)]
        """Shares whose head is of a unit in scope: the only ones this pass can change."""

    def in_scope_share(self, share: ShareRecord) -> bool:
        head = self.state.head(share)
        return head is not None and self.in_scope(head.unit)

    def in_scope(self, unit: str) -> bool:
        return self.units is None or unit in self.units

    def _setup(self) -> tuple[list[ShareRecord], bool]:
        """What a pass over this environment needs of the configuration (cached until it changes):
        its live shares, and whether its policy enables backfill."""
        shares = [s for s in self.ledger.shares if not s.deleting]
        queues = [q for q in self.state.queues.values() if q.service_environment == self.environment.name]
        policy = self.state.policies.get(queues[0].scheduling_policy) if queues else None
        return shares, policy is not None and policy.backfill

    def run(self) -> None:
        # 0. Holds whose victims are gone: dispatch the preemptor, or let it compete again.
        self.settle_holds()
        while True:
            self.revisit = False
            # 1. In-quota phase.
            blocked_in_quota = self.sweep(in_quota=True)
            # 2. Borrow phase (FIFO).
            blocked_borrowing = self.sweep(in_quota=False)
            # A borrow dispatch may give its share a new head of another unit that is within quota:
            # sweep again then, so the pass ends at a fixpoint.
            if not self.revisit:
                break
        # 3. Reclaim phase for in-quota heads that did not fit.
        waiting = [job for job in blocked_in_quota if not self.reclaim(job)]
        # 4. In-share phase for every head that still waits, then phase 3 again, until phase 4 stops
        # nothing (why: step 4 of the module docstring; found by the S3.3 fixpoint property test).
        while self.in_share_phase(waiting + blocked_borrowing):
            waiting = [job for job in waiting if not self.reclaim(job)]
        # 5. Record which heads can never run as things are (S9.1).
        record_blocked(self.ctx, self.environment, self.shares)

    # ----- phase 0 -----------------------------------------------------------------------------

    def settle_holds(self) -> None:
        if not self.state.holds:
            return
        holds = sorted(
            (
                h
                for h in self.state.holds.values()
                if h.se == self.environment.name and not h.victims and self.in_scope(h.unit)
            ),
            key=lambda h: h.job_id,
        )
        for hold in holds:
            job = self.state.jobs[hold.job_id]
            share = self.state.shares[job.share]
            if not self.try_dispatch(job, share, "HOLD"):
                self.ctx.emit(
                    ev.PreemptionHoldReleased,
                    job_id=job.job_id,
                    reason="Victims stopped but the job still does not fit",
                )

    # ----- phases 1 and 2 ----------------------------------------------------------------------

    def in_quota(self, job: JobRecord, share: ShareRecord) -> bool:
        return self.ledger.in_quota(share, job.unit, job.count)

    def candidate(self, share: ShareRecord, in_quota: bool) -> JobRecord | None:
        """The share's head if it belongs to this phase (and holds no preemption)."""
        job = self.state.head(share)
        if job is None or job.job_id in self.state.holds or not self.in_scope(job.unit):
            return None
        if not in_quota and (share.spec.strategy is not LEND_AND_BORROW or not self.may_borrow(share)):
            return None
        return job if self.in_quota(job, share) is in_quota else None

    def may_borrow(self, share: ShareRecord) -> bool:
        """S10.2: a share in reborrow backoff takes no idle capacity beyond its limit."""
        return share.backoff is None or borrow_blocked_until(share, self.ctx.now) is None

    def sweep(self, in_quota: bool) -> list[JobRecord]:
        """Dispatch heads of this phase oldest first while they fit; return the heads that did not."""
        heap: list[tuple[int, str, int]] = []
        for index, share in enumerate(self.scoped):
            job = self.candidate(share, in_quota)
            if job is not None:
                heap.append((job.created_at, job.job_id, index))
        heapq.heapify(heap)
        blocked = []
        backfilled: set[int] = set()
        phase: DispatchPhase = "IN_QUOTA" if in_quota else "BORROW"
        while heap:
            _, job_id, index = heapq.heappop(heap)
            share = self.scoped[index]
            job = self.state.jobs[job_id]
            if self.try_dispatch(job, share, phase):
                successor = self.candidate(share, in_quota)
                if successor is not None:
                    heapq.heappush(heap, (successor.created_at, successor.job_id, index))
                elif not in_quota and self.candidate(share, True) is not None:
                    # A borrower's successor of another unit may be within quota: sweep again.
                    self.revisit = True
                continue
            blocked.append(job)
            backfilled.add(index)
            while self.backfill and self.backfill_share(share, in_quota):
                pass
        if self.backfill:
            # A head that belongs to the other phase (or waits for its preemptions) cannot be placed
            # in this one either: with backfill, later jobs of its share still get a chance (S3.2).
            for index, share in enumerate(self.scoped):
                if index in backfilled or (not in_quota and share.spec.strategy is not LEND_AND_BORROW):
                    continue
                while self.backfill_share(share, in_quota):
                    pass
        return blocked

    def backfill_share(self, share: ShareRecord, in_quota: bool) -> bool:
        """Backfill extension: dispatch the first later job of the share that fits in this phase."""
        phase: DispatchPhase = "IN_QUOTA" if in_quota else "BORROW"
        if not in_quota and not self.may_borrow(share):
            return False
        for job in self.queued_after_head(share):
            if job.job_id in self.state.holds or self.in_quota(job, share) is not in_quota:
                continue
            if self.try_dispatch(job, share, phase):
                return True
        return False

    def queued_after_head(self, share: ShareRecord) -> Iterator[JobRecord]:
        for key in share.queue.islice(1, BACKFILL_SCAN + 1):
            yield self.state.jobs[key[2]]

    def over_quota_heads(self) -> list[JobRecord]:
        """Heads of RESERVE and LEND shares above their own limit: they wait unless in-share applies."""
        heads = []
        for share in self.scoped:
            if share.spec.strategy is LEND_AND_BORROW:
                continue
            job = self.state.head(share)
            if job is not None and job.job_id not in self.state.holds and not self.in_quota(job, share):
                heads.append(job)
        return heads

    def try_dispatch(self, job: JobRecord, share: ShareRecord, phase: DispatchPhase) -> bool:
        if job.job_id not in self.state.holds and self.ledger.totals(job.unit).free_slots < job.count:
            return False  # the usual answer on a full pool, without building the figures
        figures = self.ledger.figures(share, job.unit, job.count, exclude=job.job_id)
        if not figures.fits:
            return False
        avoid = (
            off_limits(self.state, job, share, self.environment.pool, self.ctx.now)
            if phase == "BORROW"
            else ()
        )
        placements = place(self.ctx, self.environment.pool, job.unit, job.count, avoid)
        if placements is None:
            return False
        attempt_number = job.attempt_number + 1
        self.ctx.emit(
            ev.JobDispatched,
            job_id=job.job_id,
            attempt_id=f"{job.job_id}#{attempt_number}",
            attempt_number=attempt_number,
            unit=job.unit,
            count=job.count,
            placements=placements,
            phase=phase,
            borrowed=max(0, min(job.count, figures.share_usage + job.count - figures.share_limit)),
        )
        return True

    # ----- phases 3 and 4 ----------------------------------------------------------------------

    def reclaim(self, job: JobRecord) -> bool:
        if job.job_id in self.state.holds:
            return True
        candidates, eligible = cross_share_candidates(self.ledger, job)
        candidates = victim_order(self.state, job, candidates, self.ctx.now)
        victims = find_victims(self.ledger, job, candidates, self.unprotected(eligible))
        if victims is None:
            return False
        self.preempt(job, victims, "CROSS_SHARE")
        return True

    def in_share_phase(self, waiting: list[JobRecord]) -> bool:
        """Phase 4 over ``waiting`` and the heads above their own limit; whether it stopped a job."""
        preempted = False
        for job in sorted(waiting + self.over_quota_heads(), key=head_order):
            preempted = self.preempt_in_share(job) or preempted
        return preempted

    def preempt_in_share(self, job: JobRecord) -> bool:
        share = self.state.shares[job.share]
        if not share.spec.in_share_preemption or job.job_id in self.state.holds:
            return False
        if self.state.head(share) is not job:
            return False
        candidates, eligible = in_share_candidates(self.ledger, job)
        candidates = victim_order(self.state, job, candidates, self.ctx.now)
        victims = find_victims(self.ledger, job, candidates, self.unprotected(eligible))
        if not victims:
            # None, or empty: the simulation says the head fits as things are, yet the earlier
            # phases did not dispatch it. Stopping nothing is no progress, and the phase loop in
            # ``run`` ends only when a round makes none.
            return False
        self.preempt(job, victims, "IN_SHARE")
        return True

    def unprotected(self, eligible: Eligible) -> Eligible:
        """S10.1: victims still within their share's minimum runtime are not eligible."""
        state, now = self.state, self.ctx.now

        def check(victim: JobRecord, removed: dict[ShareKey, int]) -> bool:
            return protected_until(state, victim, now) is None and eligible(victim, removed)

        return check

    def preempt(self, preemptor: JobRecord, victims: list[JobRecord], kind: ev.PreemptionKind) -> None:
        state = self.state
        preemptor_share = state.shares[preemptor.share]
        figures = self.ledger.figures(
            preemptor_share, preemptor.unit, preemptor.count, exclude=preemptor.job_id
        )
        for victim in victims:
            victim_share = state.shares[victim.share]
            if kind == "CROSS_SHARE":
                reason = (
                    f"Preempted (cross-share): capacity reclaimed by quota share {preemptor.share[1]} "
                    f"for job {preemptor.job_id}"
                )
            else:
                reason = (
                    f"Preempted (in-share): higher priority job {preemptor.job_id} "
                    f"(priority {preemptor.priority} > {victim.priority})"
                )
            assert victim.attempt_id is not None  # a victim is dispatched
            self.ctx.emit(
                ev.JobPreempted,
                job_id=victim.job_id,
                attempt_id=victim.attempt_id,
                preemptor_job_id=preemptor.job_id,
                preemptor_share=preemptor.share[1],
                victim_share=victim.share[1],
                kind=kind,
                status_reason=reason,
                victim_runtime_ms=0 if victim.started_at is None else self.ctx.now - victim.started_at,
                lost_ms=lost_ms(victim, self.ctx.now),
                lost_gpus=gpus_held(victim),
                figures=ev.PreemptionFigures(
                    unit=preemptor.unit,
                    preemptor_demand=preemptor.count,
                    pool_capacity=figures.capacity,
                    pool_usage=figures.usage,
                    reserved_idle=figures.reserved_idle,
                    held=figures.held,
                    preemptor_share_usage=figures.share_usage,
                    preemptor_share_limit=figures.share_limit,
                    victim_share_usage=victim_share.usage.get(victim.unit, 0),
                    victim_share_limit=victim_share.limits.get(victim.unit, 0),
                ),
            )


def head_order(job: JobRecord) -> tuple[int, str]:
    return (job.created_at, job.job_id)


def place(
    ctx: Context, pool: str, unit: str, count: int, avoid: Collection[str] = ()
) -> tuple[Placement, ...] | None:
    """S6: ``count`` slots at once or none; fullest nodes first (keeps whole nodes free), then node id;
    never on the nodes in ``avoid`` (a borrower and a plan window that would close on it, S11). While
    a training plan's window is open, its nodes come after the others: its capacity is taken last, so
    that its end stops as few jobs as it can (S11)."""
    state = ctx.state
    index = state.free_index.get((pool, unit))
    if index is None:
        return None
    nodes: list[tuple[int, str]] = index
    if state.plan_windows:
        planned = [entry for entry in index if state.nodes[entry[1]].training_plan is not None]
        if planned:
            nodes = [entry for entry in index if state.nodes[entry[1]].training_plan is None] + planned
    placements = []
    remaining = count
    for _, node_id in nodes:
        if avoid and node_id in avoid:
            continue
        node = state.nodes[node_id]
        free = node.free[unit]
        take = min(remaining, len(free))
        slots = tuple(free[:take])
        offers = node.slots
        gpus = tuple(g for slot in slots for g in offers[slot].gpus) if take > 1 else offers[slots[0]].gpus
        placements.append(fast_construct(Placement, {"node_id": node_id, "slots": slots, "gpus": gpus}))
        remaining -= take
        if remaining == 0:
            return tuple(placements)
    return None
