"""S7 as a Hypothesis state machine: random inputs, every invariant checked after every event.

The machine drives the core through ``Harness`` (decide, then evolve event by event) over one
service environment with two capacity units, three nodes and two to four random quota shares. Its
rules submit jobs, change priorities, report attempts, terminate, let time pass (timeouts, lost
nodes), deregister and re-register nodes, and change share and SE limits.

Checked at every event (with the state exactly as the core saw it):

- S7.1 / S2.5: a ``JobDispatched`` never makes ``sum_s U(s,u) + R(u) <= C(u)`` false, and places the
  attempt on free slots of usable nodes. (Lowered limits and lost nodes may break the sum
  transiently; a dispatch never does.)
- S7.2: the dispatched job holds no attempt; no attempt id is dispatched twice.
- S7.3 / S7.4: the dispatching share stays within L (RESERVE, LEND) or M (LEND_AND_BORROW).
- S7.5: a cross-share victim's share is borrowing (net of the victims already chosen for the same
  preemptor); an in-share victim has strictly lower priority than its preemptor.

After every step: slots per node are used at most once and the free lists and pool counters agree
with the placements; ``decide`` left the state unchanged (the harness checks ``fingerprint``); a
shadow state fed the JSON round-trip of every event equals the live one. At teardown (S7.6, S7.7):
with only completions and all nodes back, every share's head that fits its share and the capacity is
dispatched (later jobs wait behind an unfit head by S3.2); then replaying the log from empty gives the
live fingerprint and re-deciding every recorded input on a fresh state reproduces the events exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpuquota.core import ClusterState, decide, evolve, fingerprint, replay
from gpuquota.core.hygiene import MAX_DOUBLINGS, MIN_RUNTIME_TAG, REBORROW_BACKOFF_TAG, protected_until
from gpuquota.core.plans import STOP_AT_PLAN_END_TAG
from gpuquota.core.state import JobRecord, ShareKey
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    PlanAllocation,
    PlanWindow,
    QuotaShareSpec,
    SlotOffer,
    Strategy,
    TrainingPlanSpec,
)
from gpuquota.wire.events import EVENT_ADAPTER
from tests.builders import G5, P4, Harness, ShareBuilder, job, share

# Background threads left by other tests in the same session (Kafka clients, stack threads) may touch
# the global ``random`` module while Hypothesis draws; it then warns, and warnings are errors here. The
# machine itself never uses ``random`` (everything it draws comes from Hypothesis).
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

UNITS = (G5, P4)
NODES: dict[str, dict[str, int]] = {
    "n0": {"ml_g5_xlarge": 4},
    "n1": {"ml_g5_xlarge": 2, "ml_p4d_24xlarge": 2},
    "n2": {"ml_g5_xlarge": 2},
}
ALT_NODES: dict[str, dict[str, int]] = {
    "n0": {"ml_g5_xlarge": 3},
    "n1": {"ml_g5_xlarge": 1, "ml_p4d_24xlarge": 2},
    "n2": {"ml_g5_xlarge": 3},
}
SE_LIMITS = {G5: 6, P4: 2}

share_configs = st.tuples(
    st.sampled_from([Strategy.RESERVE, Strategy.LEND, Strategy.LEND_AND_BORROW, Strategy.LEND_AND_BORROW]),
    st.integers(1, 4),  # g5 limit
    st.integers(1, 2),  # p4 limit
    st.sampled_from([-1, 0, 50, 100, 200]),  # borrow limit (LEND_AND_BORROW only)
    st.booleans(),  # in-share preemption
)
hygiene_configs = st.tuples(
    st.sampled_from([0, 0, 10, 45]),  # gpuquota:minRuntimeSeconds (0: not set)
    st.sampled_from([0, 0, 5, 20]),  # gpuquota:reborrowBackoffSeconds (0: not set)
)


# ----- independent arithmetic (S2), from the raw state records ----------------------------------


def used(state: ClusterState, key: ShareKey, unit: str) -> int:
    """U(s,u): instances held by the share's jobs that hold an attempt (stopping ones included)."""
    return sum(j.count for j in state.jobs.values() if j.share == key and j.unit == unit and j.attempt_id)


def limit_of(spec: QuotaShareSpec, unit: str, state: ClusterState | None = None) -> int:
    """L(s,u): the spec's limit, plus what training plans with an open window allocate (S11)."""
    own = spec.limit(unit) or 0
    if state is None or own == 0:
        return own
    for name in state.plan_windows:
        plan = state.plans[name]
        if plan.unit == unit:
            own += sum(
                a.count
                for a in plan.allocations
                if (a.job_queue, a.quota_share) == (spec.job_queue, spec.name)
            )
    return own


def max_of(spec: QuotaShareSpec, unit: str, state: ClusterState | None = None) -> int | None:
    own = limit_of(spec, unit, state)
    if spec.strategy is not Strategy.LEND_AND_BORROW:
        return own
    return None if spec.borrow_limit == -1 else own + own * spec.borrow_limit // 100


def capacity(state: ClusterState, unit: str) -> int:
    """C(u) for the only SE: its limit, bounded by the slots of online, non-draining nodes."""
    (environment,) = state.environments.values()
    limit = next((c.max_capacity for c in environment.capacity_limits if c.unit == unit), 0)
    limit += sum(state.plans[name].count for name in state.plan_windows if state.plans[name].unit == unit)
    slots = sum(
        1
        for n in state.nodes.values()
        if n.online and not n.draining and (n.training_plan is None or n.training_plan in state.plan_windows)
        for slot in n.slots
        if slot.unit == unit
    )
    return min(limit, slots)


def reserved(state: ClusterState, unit: str, exclude: ShareKey | None = None) -> int:
    """R(u), optionally without one share's own reserve."""
    return sum(
        max(0, limit_of(s.spec, unit, state) - used(state, key, unit))
        for key, s in state.shares.items()
        if s.spec.strategy is Strategy.RESERVE and key != exclude
    )


def admission_holds(state: ClusterState, unit: str) -> bool:
    """S2.5's aggregate form: ``sum_s U(s,u) + R(u) <= C(u)``."""
    total = sum(used(state, key, unit) for key in state.shares)
    return total + reserved(state, unit) <= capacity(state, unit)


class CheckedHarness(Harness):
    """A harness that checks the per-event invariants and keeps a JSON-fed shadow state."""

    def __init__(self) -> None:
        super().__init__()
        self.shadow = ClusterState(self.state.heartbeat_timeout_ms)
        self.attempts: set[str] = set()
        self.admitted_before = True
        self.removed: Counter[tuple[str, str, ShareKey]] = Counter()
        """Victim instances already chosen, per (input, preemptor, victim share)."""

    def before_event(self, event: ev.SchedulerEvent) -> None:
        state = self.state
        if isinstance(event, ev.JobDispatched):
            record = state.jobs[event.job_id]
            self.admitted_before = admission_holds(state, record.unit)
            assert record.attempt_id is None and record.status.value == "RUNNABLE", event  # S7.2
            assert event.attempt_id not in self.attempts, event  # S7.2
            self.attempts.add(event.attempt_id)
            assert sum(len(p.slots) for p in event.placements) == record.count == event.count
            for placement in event.placements:
                node = state.nodes[placement.node_id]
                assert node.usable, event
                for slot in placement.slots:
                    assert node.slots[slot].unit == record.unit and slot in node.free[record.unit], event
        elif isinstance(event, ev.JobPreempted) and event.kind == "TRAINING_PLAN":
            check_plan_stop(state, event)
        elif isinstance(event, ev.JobPreempted):
            victim = state.jobs[event.job_id]
            preemptor = state.jobs[event.preemptor_job_id]
            assert victim.attempt_id == event.attempt_id and victim.stop is None, event
            # S10.1: a victim within its share's minimum runtime is never chosen.
            assert protected_until(state, victim, event.occurred_at) is None, event
            if event.kind == "CROSS_SHARE":  # S7.5
                key = (event.event_id.rsplit("/", 1)[0], preemptor.job_id, victim.share)
                spec = state.shares[victim.share].spec
                assert victim.share != preemptor.share, event
                net = used(state, victim.share, victim.unit) - self.removed[key]
                assert net > limit_of(spec, victim.unit, state), f"victim share not borrowing: {event}"
                self.removed[key] += victim.count
            else:
                assert victim.share == preemptor.share and victim.priority < preemptor.priority, event

    def after_event(self, event: ev.SchedulerEvent) -> None:
        state = self.state
        evolve(self.shadow, EVENT_ADAPTER.validate_json(event.model_dump_json()))
        if isinstance(event, ev.JobDispatched):
            record = state.jobs[event.job_id]
            unit, spec = record.unit, state.shares[record.share].spec
            if self.admitted_before:
                assert admission_holds(state, unit), f"S2.5 made false by {event}"
            total = sum(used(state, key, unit) for key in state.shares)
            others = reserved(state, unit, exclude=record.share)
            assert total + others <= capacity(state, unit), f"S2.4: other shares' reserve used by {event}"
            own, most = used(state, record.share, unit), max_of(spec, unit, state)
            assert most is None or own <= most, f"S7.4 broken by {event}"
            if event.phase == "BORROW":
                check_borrower_fits_plan(state, record, event)


def check_plan_stop(state: ClusterState, event: ev.JobPreempted) -> None:
    """S11: a plan's stop hits a job on the plan's nodes, once its window closes to new work."""
    victim = state.jobs[event.job_id]
    assert victim.attempt_id == event.attempt_id and victim.stop is None, event
    plans = {n for p in victim.placements if (n := state.nodes[p.node_id].training_plan) is not None}
    assert len(plans) >= 1, f"a plan stopped a job on no plan's node: {event}"
    assert any(event.status_reason.startswith(f"Preempted (training plan {name} ") for name in plans), event
    for name in plans:
        window, plan = state.plan_windows.get(name), state.plans.get(name)
        if window is not None and plan is not None:
            closes = max(window[0], window[1] - plan.grace_seconds * 1000)
            if event.status_reason.endswith("window ended)"):
                assert event.occurred_at >= closes, f"stopped before the window closes: {event}"


def check_borrower_fits_plan(state: ClusterState, record: JobRecord, event: ev.JobDispatched) -> None:
    """S11: a borrower on a plan's node ends before the window closes, or its share opted in."""
    if state.shares[record.share].spec.tags.get(STOP_AT_PLAN_END_TAG) == "true":
        return
    for placement in event.placements:
        name = state.nodes[placement.node_id].training_plan
        if name is None:
            continue
        window, plan = state.plan_windows[name], state.plans[name]
        closes = max(window[0], window[1] - plan.grace_seconds * 1000)
        duration = record.attempt_duration_seconds
        assert duration is not None and event.occurred_at + duration * 1000 <= closes, event


def check_plan_nodes(state: ClusterState) -> None:
    """S11: nothing runs on a plan's node outside its windows unless it is being stopped."""
    for record in state.jobs.values():
        for placement in record.placements:
            name = state.nodes[placement.node_id].training_plan
            if name is not None and name not in state.plan_windows:
                assert record.stop is not None, f"{record.job_id} runs on closed plan {name}'s node"


def check_nodes(state: ClusterState) -> None:
    """S7.1: every slot is used at most once, and free lists and pool counters agree."""
    holders: dict[tuple[str, int], str] = {}
    for record in state.jobs.values():
        for placement in record.placements:
            node = state.nodes[placement.node_id]
            assert node.online, f"{record.job_id} placed on lost node {node.node_id}"
            for slot in placement.slots:
                assert (node.node_id, slot) not in holders, f"slot {node.node_id}/{slot} used twice"
                holders[node.node_id, slot] = record.job_id
    slots: Counter[str] = Counter()
    free: Counter[str] = Counter()
    for node in state.nodes.values():
        for unit in UNITS:
            indices = {i for i, s in enumerate(node.slots) if s.unit == unit}
            busy = {i for i in indices if (node.node_id, i) in holders}
            assert set(node.free.get(unit, ())) == indices - busy, f"free slots of {node.node_id} {unit}"
            if node.usable:
                slots[unit] += len(indices)
                free[unit] += len(indices - busy)
    for unit in UNITS:
        assert state.pool_slots.get("default", {}).get(unit, 0) == slots[unit], unit
        assert state.pool_free.get("default", {}).get(unit, 0) == free[unit], unit


def check_jobs(state: ClusterState) -> None:
    for key, s in state.shares.items():
        for unit in UNITS:
            assert s.usage.get(unit, 0) == used(state, key, unit), (key, unit)
    for record in state.jobs.values():
        if record.status.value == "RUNNABLE":
            assert record.attempt_id is None and not record.placements, record.job_id
        else:
            assert record.attempt_id is not None, record.job_id


class SchedulerMachine(RuleBasedStateMachine):
    HYGIENE = False
    """Whether shares opt in to S10's preemption hygiene (S10.4: the invariants hold both ways)."""

    def __init__(self) -> None:
        super().__init__()
        self.h = CheckedHarness()
        self.specs: list[ShareBuilder] = []
        self.serial = 0

    # ----- setup -----------------------------------------------------------------------------------

    @initialize(
        configs=st.lists(share_configs, min_size=2, max_size=4),
        hygiene=st.lists(hygiene_configs, min_size=4, max_size=4),
    )
    def setup(
        self, configs: list[tuple[Strategy, int, int, int, bool]], hygiene: list[tuple[int, int]]
    ) -> None:
        h = self.h
        h.policy().environment_limits("se", SE_LIMITS).queue()
        for node_id, units in NODES.items():
            h.node(node_id, "default", **units)
        for index, (strategy, g5, p4, borrow, in_share) in enumerate(configs):
            builder = share(f"S{index}").limit(g5).limit(p4, P4).in_share_preemption(in_share)
            min_runtime, backoff = hygiene[index]
            if self.HYGIENE and min_runtime:
                builder.tag(MIN_RUNTIME_TAG, str(min_runtime))
            if self.HYGIENE and backoff:
                builder.tag(REBORROW_BACKOFF_TAG, str(backoff))
            if strategy is Strategy.RESERVE:
                builder.reserve()
            elif strategy is Strategy.LEND:
                builder.lend()
            else:
                builder.lend_and_borrow(borrow)
            self.specs.append(builder)
            h.share(builder)

    # ----- helpers ---------------------------------------------------------------------------------

    def live(self) -> list[JobRecord]:
        return sorted(self.h.state.jobs.values(), key=lambda j: j.job_id)

    def dispatched(self) -> list[JobRecord]:
        return [j for j in self.live() if j.attempt_id is not None]

    # ----- rules -----------------------------------------------------------------------------------

    jobs_to_submit = st.lists(
        st.tuples(
            st.integers(0, 3),  # share
            st.integers(0, 3),  # priority
            st.integers(1, 3),  # count
            st.sampled_from(UNITS),
            st.sampled_from([None, 0, 1]),  # preemptionRetriesBeforeTermination
            st.integers(1, 2),  # retry attempts
            st.sampled_from([None, None, 30]),  # attemptDurationSeconds
        ),
        min_size=1,
        max_size=3,
    )

    def submit_jobs(self, specs: list[tuple[int, int, int, str, int | None, int, int | None]]) -> None:
        for share_index, priority, count, unit, preemption_retries, attempts, timeout in specs:
            self.serial += 1
            builder = job(f"j{self.serial}").share(f"S{share_index % len(self.specs)}").priority(priority)
            builder.needs(count if unit == G5 else min(count, 2), unit).retries(attempts)
            if preemption_retries is not None:
                builder.preemption_retries(preemption_retries)
            if timeout is not None:
                builder.timeout(timeout)
            self.h.submit(builder)

    @rule(specs=jobs_to_submit)
    def submit(self, specs: list[tuple[int, int, int, str, int | None, int, int | None]]) -> None:
        self.submit_jobs(specs)

    @rule(share_index=st.integers(0, 3), unit=st.sampled_from(UNITS), size=st.integers(2, 5))
    def flood(self, share_index: int, unit: str, size: int) -> None:
        """Several one-instance jobs for one LEND_AND_BORROW share (if any): it starts borrowing."""
        borrowers = [i for i, b in enumerate(self.specs) if b.fields["strategy"] is Strategy.LEND_AND_BORROW]
        target = borrowers[share_index % len(borrowers)] if borrowers else share_index
        self.submit_jobs([(target, 0, 1, unit, None, 1, None)] * size)

    @rule(specs=jobs_to_submit)
    def submit_more(self, specs: list[tuple[int, int, int, str, int | None, int, int | None]]) -> None:
        self.submit_jobs(specs)

    @precondition(lambda self: bool(self.h.state.jobs))
    @rule(pick=st.integers(0, 10_000), priority=st.integers(0, 3))
    def set_priority(self, pick: int, priority: int) -> None:
        jobs = self.live()
        self.h.set_priority(jobs[pick % len(jobs)].job_id, priority)

    reports = st.sampled_from(["STARTING", "RUNNING", "SUCCEEDED", "SUCCEEDED", "FAILED", "STOPPED"])

    def report_on(self, pick: int, status: str) -> None:
        jobs = self.dispatched()
        record = jobs[pick % len(jobs)]
        if record.stop is not None and status in ("STARTING", "RUNNING"):
            status = "STOPPED"  # a node told to stop mostly does so
        fields: dict[str, Any] = {"exit_code": 1} if status == "FAILED" else {}
        self.h.report(record.job_id, status, **fields)

    @precondition(lambda self: any(j.attempt_id for j in self.h.state.jobs.values()))
    @rule(pick=st.integers(0, 10_000), status=reports)
    def report(self, pick: int, status: str) -> None:
        self.report_on(pick, status)

    @precondition(lambda self: any(j.attempt_id for j in self.h.state.jobs.values()))
    @rule(pick=st.integers(0, 10_000), status=reports)
    def report_more(self, pick: int, status: str) -> None:
        self.report_on(pick, status)

    @precondition(lambda self: any(j.stop is not None for j in self.h.state.jobs.values()))
    @rule()
    def stopping_attempts_stop(self) -> None:
        """The node agents report every attempt they were told to stop as stopped."""
        self.h.stop_all_preempted()

    @precondition(lambda self: bool(self.h.state.jobs))
    @rule(pick=st.integers(0, 10_000))
    def terminate(self, pick: int) -> None:
        jobs = self.live()
        self.h.terminate(jobs[pick % len(jobs)].job_id)

    @rule(ms=st.sampled_from([1_000, 20_000, 61_000]))
    def time_passes(self, ms: int) -> None:
        self.h.elapse(ms)

    @rule(
        node_id=st.sampled_from(sorted(NODES)),
        action=st.sampled_from(["silent", "deregister", "register", "register-other-slots"]),
    )
    def node_event(self, node_id: str, action: str) -> None:
        """S5.7: a node misses its heartbeats (the others keep beating) or deregisters; or a node
        (re-)registers, possibly with other slots (rejected while it runs attempts)."""
        if action == "silent":
            self.h.elapse(38_000, silent=[node_id])
        elif action == "deregister":
            self.h.deregister(node_id)
        else:
            layout = ALT_NODES if action == "register-other-slots" else NODES
            self.h.node(node_id, "default", **layout[node_id])

    @rule(
        share_index=st.one_of(st.none(), st.integers(0, 3)),
        g5=st.integers(1, 4),
        p4=st.integers(1, 2),
        se_g5=st.sampled_from([3, 6, 8]),
    )
    def change_limits(self, share_index: int | None, g5: int, p4: int, se_g5: int) -> None:
        """S4.5: a share's limits (or, for ``None``, the SE's g5 limit) change."""
        if share_index is None:
            self.h.environment_limits("se", {G5: se_g5, P4: SE_LIMITS[P4]})
            return
        builder = self.specs[share_index % len(self.specs)]
        builder.limit(g5).limit(p4, P4)
        self.h.share(builder)

    # ----- invariants ------------------------------------------------------------------------------

    @invariant()
    def state_is_consistent(self) -> None:
        state = self.h.state
        check_nodes(state)
        check_jobs(state)
        check_plan_nodes(state)
        assert fingerprint(self.h.shadow) == fingerprint(state), "JSON-fed shadow state differs"

    @invariant()
    def pass_is_a_fixpoint(self) -> None:
        """S3.3: the pass after each input decided everything; a forced full pass decides nothing."""
        state = self.h.state
        if "policy" not in state.policies:
            return
        probe = inp.UpdateSchedulingPolicy(
            event_id="probe", occurred_at=self.h.now, spec=state.policies["policy"]
        )
        missed = [e for e in decide(state, probe) if not isinstance(e, ev.SchedulingPolicyChanged)]
        assert not missed, f"a full pass still decides {missed}"

    # ----- teardown: liveness and replay -----------------------------------------------------------

    def teardown(self) -> None:
        if not self.h.state.shares:
            return
        self.quiesce()
        for _ in range(10 if self.HYGIENE else 0):
            # S10: protections and backoffs end with time; let it pass until nothing new runs.
            self.h.elapse(HYGIENE_SETTLE_MS)
            if not self.dispatched():
                break
            self.quiesce()
        self.check_liveness()
        self.check_replay()

    def quiesce(self) -> None:
        """S7.7's setting: all nodes back, then only completions until nothing holds capacity."""
        h = self.h
        for node_id, units in NODES.items():
            node = h.state.nodes.get(node_id)
            if node is None or not node.online:
                h.node(node_id, "default", **units)
        for _ in range(20 * (len(h.state.jobs) + 5)):
            jobs = self.dispatched()
            if not jobs:
                break
            record = jobs[0]
            h.report(record.job_id, "STOPPED" if record.stop is not None else "SUCCEEDED")
        assert not self.dispatched(), "completions did not drain the cluster"
        assert not h.state.holds, "a hold survived with no victim stopping"

    def check_liveness(self) -> None:
        state = self.h.state
        for key, s in state.shares.items():
            head = state.head(s)
            if head is None:
                continue
            unit, k, spec = head.unit, head.count, s.spec
            most = max_of(spec, unit, state)
            fits_share = k <= limit_of(spec, unit, state) or (
                spec.strategy is Strategy.LEND_AND_BORROW and (most is None or k <= most)
            )
            others = sum(
                limit_of(r.spec, unit, state)
                for other, r in state.shares.items()
                if other != key and r.spec.strategy is Strategy.RESERVE
            )
            assert not (
                fits_share and k + others <= capacity(state, unit)
            ), f"S7.7: head {head.job_id} of {key} fits ({k} {unit}) but stays RUNNABLE"

    def check_replay(self) -> None:
        h = self.h
        timeout = h.state.heartbeat_timeout_ms
        assert fingerprint(replay(h.events, timeout)) == fingerprint(h.state), "S7.6: replay differs"
        fresh = ClusterState(timeout)
        for message, recorded in h.decisions:
            events = decide(fresh, message)
            assert [e.model_dump() for e in events] == [e.model_dump() for e in recorded], message
            for event in events:
                evolve(fresh, event)


def machine_settings(max_examples: int) -> settings:
    """The state machines' settings: reproducible runs of 40 steps, as many as ``max_examples``."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=40,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


SchedulerMachine.TestCase.settings = machine_settings(200)
TestSchedulerInvariants = SchedulerMachine.TestCase


def test_registered_slot_offers_are_sane() -> None:
    """The machine's node configurations stay within the SE (guards the liveness arithmetic)."""
    for layout in (NODES, ALT_NODES):
        offered = Counter(unit.replace("_", ".") for units in layout.values() for unit in units)
        assert set(offered) <= set(UNITS)
    assert SlotOffer(unit=G5).gpus == ()


class HygieneMachine(SchedulerMachine):
    HYGIENE = True


HYGIENE_SETTLE_MS = 20_000 << MAX_DOUBLINGS
HygieneMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSchedulerInvariantsWithHygiene = HygieneMachine.TestCase


PLAN_NODE = "np"
PLAN_WINDOWS = tuple(
    PlanWindow(start=1_010_000 + k * 90_000, end=1_010_000 + k * 90_000 + 60_000) for k in range(40)
)
"""Windows of 60 s every 90 s from 10 s after the harness's start: the machine's steps of time (1 s,
20 s, 61 s, 38 s) land both inside and outside them, and across their closing."""


class PlanMachine(SchedulerMachine):
    """S11: a training plan with a node of its own; S7's invariants hold with its windows."""

    setup = None  # type: ignore[assignment]  # replaced by ``setup_with_plan``

    @initialize(
        configs=st.lists(share_configs, min_size=2, max_size=4),
        hygiene=st.lists(hygiene_configs, min_size=4, max_size=4),
        opt_in=st.booleans(),
        allocation=st.integers(0, 2),
    )
    def setup_with_plan(
        self,
        configs: list[tuple[Strategy, int, int, int, bool]],
        hygiene: list[tuple[int, int]],
        opt_in: bool,
        allocation: int,
    ) -> None:
        SchedulerMachine.setup(self, configs, hygiene)
        h = self.h
        slots = (SlotOffer(unit=G5, gpus=(20,)), SlotOffer(unit=G5, gpus=(21,)))
        h.feed(inp.RegisterNode, node_id=PLAN_NODE, slots=slots, training_plan="tp")
        if opt_in:
            self.specs[0].tag(STOP_AT_PLAN_END_TAG, "true")
            h.share(self.specs[0])
        allocations = (
            () if allocation == 0 else (PlanAllocation(job_queue="jq", quota_share="S0", count=allocation),)
        )
        plan = TrainingPlanSpec(
            name="tp",
            service_environment="se",
            unit=G5,
            count=2,
            windows=PLAN_WINDOWS,
            allocations=allocations,
            grace_seconds=5,
        )
        h.feed(inp.PutTrainingPlan, spec=plan)
        assert "tp" in h.state.plans

    def teardown(self) -> None:
        """S7.7 is about capacity that stays: the plan's goes with its window, so delete it first."""
        if self.h.state.shares and "tp" in self.h.state.plans:
            self.h.feed(inp.DeleteTrainingPlan, name="tp")
        super().teardown()


PlanMachine.TestCase.settings = machine_settings(100)
TestSchedulerInvariantsWithPlans = PlanMachine.TestCase
