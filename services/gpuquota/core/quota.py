"""Quota arithmetic (semantics S2): every capacity term, one small function each.

Theory of operation
-------------------
All figures are per service environment ``e`` and capacity unit ``u`` (an instance type).

- ``limit L(s,u)``: what share ``s`` may use without borrowing (0 when it has no limit for ``u``).
- ``max usage M(s,u)``: ``L`` for RESERVE and LEND; ``L + floor(L * borrowLimit / 100)`` for
  LEND_AND_BORROW, unbounded (``None``) when ``borrowLimit`` is -1 (S2.3).
- ``usage U(s,u)``: instances held by the share's dispatched jobs, stopping ones included (S2.2),
  plus capacity *held* for its preemptors whose victims are still stopping (S4.3). A hold counts as
  a virtual dispatch, so nobody else takes the capacity it protects; the preemptor itself is
  evaluated with its own hold removed (``exclude``).
- ``reserved idle R(e,u)``: the sum over RESERVE shares of ``max(0, L - U)`` (S2.4).
- ``capacity C(e,u)``: ``min(SE.maxCapacity(u), usable slots of the pool - other SEs' usage)`` (S2.1);
  while a training plan's window is open, ``maxCapacity(u)`` rises by the plan's ``count`` and an
  allocated share's ``L`` by its allocation (S11: ``plan_capacity``, ``plan_allocations``).
- The admission constraint (S2.5): after a dispatch of ``k``, ``sum_s U(s,u) + R(e,u) <= C(e,u)``
  and ``U(s,u) <= M(s,u)``. Placement additionally needs ``k`` free slots on usable nodes (S6).

``Figures`` gathers these numbers once for one job; admission, preemption and explanations all
read the same figures, so they can never disagree about what "fits" means.
"""

from __future__ import annotations

from gpuquota.core.state import (
    ENABLED,
    LEND_AND_BORROW,
    RESERVE,
    ClusterState,
    Hold,
    JobRecord,
    ShareKey,
    ShareRecord,
)
from gpuquota.wire.base import UNLIMITED_BORROW, QuotaShareSpec, ServiceEnvironmentSpec


def share_limit(share: ShareRecord, unit: str) -> int:
    """L(s,u): the share's own capacity for ``unit``; 0 when it lists no limit for it."""
    return share.limits.get(unit, 0)


def share_max_usage(share: ShareRecord, unit: str) -> int | None:
    """M(s,u): the most the share may ever hold of ``unit``; ``None`` means unbounded (S2.3)."""
    return max_usage(share.spec, share.limits.get(unit))


def max_usage(spec: QuotaShareSpec, own: int | None) -> int | None:
    """M(s,u) from the share's spec and its own limit L(s,u) for the unit (``None``: it lists none).

    Pure, for the read side too (``gpuquota shares``, the console, the metrics), which has specs but
    no ``ClusterState``."""
    if own is None:
        return 0
    if spec.strategy is not LEND_AND_BORROW:
        return own
    if spec.borrow_limit == UNLIMITED_BORROW:
        return None
    return own + own * spec.borrow_limit // 100


def hold_outstanding(state: ClusterState, hold: Hold) -> int:
    """The part of a hold not yet covered by its victims' own usage.

    While a victim stops it still counts in its share's usage; counting the preemptor's whole demand
    too would count the same instances twice. A hold therefore adds only what its stopping victims
    do not already account for, which is its whole demand once they are gone.
    """
    jobs = state.jobs
    covered = sum(jobs[v].count for v in hold.victims if v in jobs)
    return max(0, hold.count - covered)


def hold_slot_claim(state: ClusterState, hold: Hold) -> int:
    """Free slots a hold protects: its demand less the slots its victims still occupy."""
    jobs = state.jobs
    occupied = sum(usable_slots(state, jobs[v]) for v in hold.victims if v in jobs)
    return max(0, hold.count - occupied)


def usable_slots(state: ClusterState, job: JobRecord) -> int:
    """Slots the job holds on online, non-draining nodes (what stopping it frees for placement)."""
    total = 0
    for placement in job.placements:
        node = state.nodes.get(placement.node_id)
        if node is not None and node.usable:
            total += len(placement.slots)
    return total


def held_by(state: ClusterState, share: ShareKey, unit: str, exclude: str | None = None) -> int:
    """Capacity of ``unit`` held for the share's preemptors (S4.3), except ``exclude``'s hold."""
    return sum(
        hold_outstanding(state, h)
        for h in state.holds.values()
        if h.share == share and h.unit == unit and h.job_id != exclude
    )


def share_usage(state: ClusterState, share: ShareRecord, unit: str, exclude: str | None = None) -> int:
    """U(s,u): dispatched instances (stopping ones included) plus holds (S2.2, S4.3)."""
    return share.usage.get(unit, 0) + held_by(state, share.key, unit, exclude)


def shares_of_environment(state: ClusterState, environment: str) -> list[ShareRecord]:
    """The quota shares of every job queue attached to ``environment``."""
    key = ("shares", environment)
    shares: list[ShareRecord] | None = state.cached(key)
    if shares is None:
        queues = set(queues_of_environment(state, environment))
        shares = state.cache(key, [share for k, share in state.shares.items() if k[0] in queues])
    return shares


def reserve_shares_of_environment(state: ClusterState, environment: str) -> list[ShareRecord]:
    """The RESERVE shares of ``environment``: the only ones with reserved idle capacity (S2.4)."""

    key = ("reserve-shares", environment)
    shares: list[ShareRecord] | None = state.cached(key)
    if shares is None:
        every = shares_of_environment(state, environment)
        shares = state.cache(key, [s for s in every if s.spec.strategy is RESERVE])
    return shares


def queues_of_environment(state: ClusterState, environment: str) -> list[str]:
    key = ("queues", environment)
    queues: list[str] | None = state.cached(key)
    if queues is None:
        names = sorted(q.name for q in state.queues.values() if q.service_environment == environment)
        queues = state.cache(key, names)
    return queues


def reserved_idle(
    state: ClusterState, shares: list[ShareRecord], unit: str, exclude: str | None = None
) -> int:
    """R(e,u): idle capacity of RESERVE shares, which nobody else may use (S2.4)."""
    return sum(
        max(0, share_limit(s, unit) - share_usage(state, s, unit, exclude))
        for s in shares
        if s.spec.strategy is RESERVE
    )


def environment_usage(state: ClusterState, environment: str, unit: str) -> int:
    """Instances of ``unit`` held by the jobs of every share of ``environment`` (holds excluded)."""
    usage = state.queue_usage
    return sum(usage.get((queue, unit), 0) for queue in queues_of_environment(state, environment))


def environment_limit(environment: ServiceEnvironmentSpec, unit: str) -> int:
    for cap in environment.capacity_limits:
        if cap.unit == unit:
            return cap.max_capacity
    return 0


def pool_capacity(state: ClusterState, environment: ServiceEnvironmentSpec, unit: str) -> int:
    """C(e,u) (S2.1): the SE's limit, bounded by the pool's usable slots less other SEs' usage."""
    neighbours, limits = _pool_layout(state, environment)
    others = sum(environment_usage(state, name, unit) for name in neighbours) if neighbours else 0
    slots = state.pool_slots.get(environment.pool, {}).get(unit, 0)
    return max(0, min(limits.get(unit, 0), slots - others))


def _pool_layout(
    state: ClusterState, environment: ServiceEnvironmentSpec
) -> tuple[list[str], dict[str, int]]:
    """The other environments of the environment's pool, and its limit per unit (cached)."""

    key = ("pool-layout", environment.name)
    layout: tuple[list[str], dict[str, int]] | None = state.cached(key)
    if layout is None:
        neighbours = sorted(
            e.name
            for e in state.environments.values()
            if e.pool == environment.pool and e.name != environment.name
        )
        limits = {cap.unit: environment_limit(environment, cap.unit) for cap in environment.capacity_limits}
        for unit, extra in plan_capacity(state, environment.name).items():
            limits[unit] = limits.get(unit, 0) + extra
        layout = state.cache(key, (neighbours, limits))
    return layout


def plan_capacity(state: ClusterState, environment: str) -> dict[str, int]:
    """Per unit: what open training plans add to the environment's ``maxCapacity`` (S11)."""
    extra: dict[str, int] = {}
    for name in state.plan_windows:
        plan = state.plans.get(name)
        if plan is not None and plan.service_environment == environment:
            extra[plan.unit] = extra.get(plan.unit, 0) + plan.count
    return extra


def plan_allocations(state: ClusterState, share: ShareKey) -> dict[str, int]:
    """Per unit: what open training plans allocate to ``share``, added to its limit ``L`` (S11)."""
    extra: dict[str, int] = {}
    for name in state.plan_windows:
        plan = state.plans.get(name)
        if plan is None:
            continue
        for allocation in plan.allocations:
            if (allocation.job_queue, allocation.quota_share) == share:
                extra[plan.unit] = extra.get(plan.unit, 0) + allocation.count
    return extra


def plans_could_add(
    state: ClusterState, environment: str, share: ShareKey, unit: str
) -> tuple[int, int, int]:
    """What training plans could ever add, open or not (S11): to the environment's ``maxCapacity``
    for ``unit``, to ``share``'s limit for it, and slots of the pool's plan nodes waiting for a
    window. A job that only a window would let run waits for it: it is not blocked (S9)."""
    capacity = allocated = 0
    for plan in state.plans.values():
        if plan.service_environment != environment or plan.unit != unit:
            continue
        capacity += plan.count
        allocated += sum(a.count for a in plan.allocations if (a.job_queue, a.quota_share) == share)
    spec = state.environments.get(environment)
    waiting = 0
    if spec is not None and state.plans:
        for node in state.nodes.values():
            if node.plan_closed and node.online and not node.draining and node.pool == spec.pool:
                waiting += sum(1 for slot in node.slots if slot.unit == unit)
    return capacity, allocated, waiting


def free_slots(state: ClusterState, pool: str, unit: str) -> int:
    """Free slots of ``unit`` on the pool's online, non-draining nodes."""
    return state.pool_free.get(pool, {}).get(unit, 0)


class Figures:
    """The capacity figures that decide whether one job of one share fits, as of now.

    Treat as immutable. A plain class, not a dataclass: the scheduling pass builds one for every head
    it tries, and mypyc compiles a plain class's constructor (``gpuquota.native.loader``), not a slotted
    dataclass's generated one.
    """

    __slots__ = (
        "capacity",
        "demand",
        "environment_enabled",
        "free_slots",
        "held",
        "own_reserved_idle",
        "reserved_idle",
        "share_limit",
        "share_max",
        "share_usage",
        "unit",
        "usage",
    )

    def __init__(
        self,
        *,
        unit: str,
        demand: int,
        capacity: int,
        usage: int,
        reserved_idle: int,
        held: int,
        share_usage: int,
        share_limit: int,
        share_max: int | None,
        free_slots: int,
        environment_enabled: bool,
        own_reserved_idle: int = 0,
    ) -> None:
        self.unit = unit
        self.demand = demand
        self.capacity = capacity
        self.usage = usage
        """sum of U(s,u) over the environment's shares, holds included."""
        self.reserved_idle = reserved_idle
        self.held = held
        self.share_usage = share_usage
        self.share_limit = share_limit
        self.share_max = share_max
        self.free_slots = free_slots
        self.environment_enabled = environment_enabled
        self.own_reserved_idle = own_reserved_idle
        """The part of ``reserved_idle`` that is this job's own RESERVE share's idle capacity (S2.4)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Figures({fields})"

    @property
    def in_quota(self) -> bool:
        """S2.7: the job fits its share's own limit."""
        return self.share_usage + self.demand <= self.share_limit

    @property
    def within_share_max(self) -> bool:
        return self.share_max is None or self.share_usage + self.demand <= self.share_max

    @property
    def within_capacity(self) -> bool:
        """S2.5 for this dispatch: other RESERVE shares' idle capacity is off limits, but a share's own
        reserve never blocks its own jobs (S2.4), even where reservations exceed the capacity."""
        return self.usage + self.reserved_idle - self.own_reserved_idle + self.demand <= self.capacity

    @property
    def placeable(self) -> bool:
        return self.free_slots >= self.demand

    @property
    def fits(self) -> bool:
        """S2.5 and S6: the job can be dispatched now."""
        return self.environment_enabled and self.within_share_max and self.within_capacity and self.placeable


def figures_for(
    state: ClusterState, share: ShareRecord, unit: str, demand: int, exclude: str | None = None
) -> Figures | None:
    """The figures for ``demand`` instances of ``unit`` in ``share``; ``None`` without an SE."""
    environment = state.environment_of_queue(share.key[0])
    if environment is None:
        return None
    return Ledger(state, environment).figures(share, unit, demand, exclude)


class Totals:
    """Environment-wide figures for one unit, holds included (treat as immutable, like ``Figures``)."""

    __slots__ = ("capacity", "enabled", "free_slots", "held", "held_by_share", "reserved_idle", "usage")

    def __init__(
        self,
        *,
        capacity: int,
        usage: int,
        reserved_idle: int,
        held: int,
        free_slots: int,
        enabled: bool,
        held_by_share: dict[ShareKey, int],
    ) -> None:
        self.capacity = capacity
        self.usage = usage
        self.reserved_idle = reserved_idle
        self.held = held
        self.free_slots = free_slots
        self.enabled = enabled
        self.held_by_share = held_by_share


class Ledger:
    """The quota figures of one service environment, cached while the state does not change.

    A scheduling pass evaluates many heads against the same environment totals; the totals are
    recomputed only after an event has been applied (``state.applied`` moved). Figures for a job that
    holds capacity (``exclude``) are derived from the totals by taking its own hold out again.
    """

    def __init__(self, state: ClusterState, environment: ServiceEnvironmentSpec) -> None:
        self.state = state
        self.environment = environment
        self.shares = shares_of_environment(state, environment.name)
        self.reserve_shares = reserve_shares_of_environment(state, environment.name)
        self._totals: dict[str, tuple[int, Totals]] = {}

    def totals(self, unit: str) -> Totals:
        state = self.state
        cached = self._totals.get(unit)
        if cached is not None and cached[0] == state.applied:
            return cached[1]
        held_by_share: dict[ShareKey, int] = {}
        claims = 0
        for hold in state.holds.values():
            if hold.se == self.environment.name and hold.unit == unit:
                held_by_share[hold.share] = held_by_share.get(hold.share, 0) + hold_outstanding(state, hold)
                # Slots freed by stopping victims are for their preemptor: others see them as taken.
                claims += hold_slot_claim(state, hold)
        held = sum(held_by_share.values())
        reserved = 0
        for s in self.reserve_shares:
            idle = s.limits.get(unit, 0) - s.usage.get(unit, 0) - held_by_share.get(s.key, 0)
            if idle > 0:
                reserved += idle
        totals = Totals(
            capacity=pool_capacity(state, self.environment, unit),
            usage=environment_usage(state, self.environment.name, unit) + held,
            reserved_idle=reserved,
            held=held,
            free_slots=free_slots(state, self.environment.pool, unit) - claims,
            enabled=self.environment.state is ENABLED,
            held_by_share=held_by_share,
        )
        self._totals[unit] = (state.applied, totals)
        return totals

    def share_usage(self, share: ShareRecord, unit: str, exclude: str | None = None) -> int:
        """U(s,u) from the cached totals (``exclude``'s own hold taken out)."""
        usage = share.usage.get(unit, 0) + self.totals(unit).held_by_share.get(share.key, 0)
        hold = self.state.holds.get(exclude) if exclude is not None else None
        if hold is not None and hold.share == share.key and hold.unit == unit:
            usage -= hold_outstanding(self.state, hold)
        return usage

    def in_quota(self, share: ShareRecord, unit: str, demand: int) -> bool:
        """S2.7 without building ``Figures`` (the scheduling pass asks this for every head)."""
        held = self.totals(unit).held_by_share.get(share.key, 0) if self.state.holds else 0
        return share.usage.get(unit, 0) + held + demand <= share.limits.get(unit, 0)

    def figures(self, share: ShareRecord, unit: str, demand: int, exclude: str | None = None) -> Figures:
        totals = self.totals(unit)
        limit = share_limit(share, unit)
        held = totals.held_by_share.get(share.key, 0)
        usage = share.usage.get(unit, 0) + held
        env_usage, env_held = totals.usage, totals.held
        reserved, free = totals.reserved_idle, totals.free_slots
        hold = self.state.holds.get(exclude) if exclude is not None else None
        is_reserve = share.spec.strategy is RESERVE
        if hold is not None and hold.unit == unit and hold.se == self.environment.name:
            # The job's own hold protects capacity *for* it: take it out of every figure.
            outstanding = hold_outstanding(self.state, hold)
            env_usage -= outstanding
            env_held -= outstanding
            free += hold_slot_claim(self.state, hold)
            if hold.share == share.key:
                before = max(0, limit - usage)
                usage -= outstanding
                if is_reserve:
                    reserved += max(0, limit - usage) - before
        return Figures(
            unit=unit,
            demand=demand,
            capacity=totals.capacity,
            usage=env_usage,
            reserved_idle=reserved,
            held=env_held,
            share_usage=usage,
            share_limit=limit,
            share_max=share_max_usage(share, unit),
            free_slots=free,
            environment_enabled=totals.enabled,
            own_reserved_idle=max(0, limit - usage) if is_reserve else 0,
        )


def attribute_lent(capacity: int, limits: list[int], used: list[int], lends: list[bool]) -> dict[int, int]:
    """Instances of one unit that each share lends (by index; shares in name order): the borrowed
    instances that the capacity no share covers cannot explain are attributed to the idle quota of the
    shares that lend (not RESERVE), in order. A display figure, not a decision input."""
    covered = sum(limits)
    borrowed = sum(max(0, u - limit) for u, limit in zip(used, limits, strict=True))
    to_attribute = max(0, borrowed - max(0, capacity - covered))
    out: dict[int, int] = {}
    for index, limit in enumerate(limits):
        if to_attribute <= 0:
            break
        idle = max(0, limit - used[index])
        if lends[index] and idle:
            given = min(idle, to_attribute)
            out[index] = given
            to_attribute -= given
    return out
