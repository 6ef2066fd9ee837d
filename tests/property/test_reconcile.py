"""Node reconciliation (docs/semantics.md, "Nodes and restarts") as a Hypothesis state machine.

The machine keeps a model of the real world next to the core: per node, whether its agent is up and
the attempts it knows (running ones, and finished ones whose final report the scheduler has not
acknowledged yet). Its rules deliver ``RunAttempt`` commands (lost while the agent is down), let
attempts start and finish with their reports delivered or swallowed by a crash, crash agents (their
processes survive or die; the attempts they had not recorded yet are forgotten; their undelivered
commands are delivered again after the restart, as the command feed resumes at its last committed
offset), restart them (with the same or fewer slots), heartbeat and let time pass.

Incarnations: each registration draws a new one and a ``RunAttempt`` carries its node's incarnation
at dispatch; the agent drops one addressed to another. Whenever an agent accepts a ``RunAttempt``,
the log assigns that one-node attempt to that node (a command a restarted agent received again, whose
attempt the registration requeued, never starts: its job may run elsewhere by then). A part of an
attempt spread over nodes may arrive after another node's registration requeued the attempt: the
``StopAttempt`` that requeue sends follows it on the node's ordered feed.

After every step, S7.1 holds: every slot is used at most once and the free lists and pool counters
agree with the placements. At teardown, once every agent is up again, has registered and heartbeated
with what it really runs and delivered its reports: every attempt the log assigns to a node runs
there unless its part there has ended while another node's part runs (no slot stays used by an
attempt no node runs), no node runs an attempt the log does not
assign to it, every attempt id was dispatched at most once, and every one-node job whose assigned
attempt exited 0 (its node not lost before it reported) is SUCCEEDED.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpuquota.core import ClusterState
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import AttemptStatus, NodeAttempt
from tests.builders import G5, Harness, job, share

pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

NODES = ("n0", "n1")
SLOTS = 3
OVER = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class Agent:
    up: bool = True
    attempts: dict[str, NodeAttempt] = field(default_factory=dict)
    inbox: list[tuple[str, str, str]] = field(default_factory=list)
    """(job id, attempt id, incarnation) of the RunAttempt commands not yet delivered."""
    incarnation: str = ""
    sent_to: dict[str, str] = field(default_factory=dict)
    """Attempt id -> the incarnation its RunAttempt was addressed to."""

    def known(self) -> tuple[NodeAttempt, ...]:
        return tuple(self.attempts[a] for a in sorted(self.attempts))


def slot_list(count: int) -> tuple[SlotOffer, ...]:
    return tuple(SlotOffer(unit=G5, gpus=(i,)) for i in range(count))


class World(Harness):
    def __init__(self) -> None:
        super().__init__(heartbeat_timeout_ms=30_000)
        self.agents = {n: Agent() for n in NODES}
        self.dispatched: Counter[str] = Counter()
        self.spread: set[str] = set()
        """Attempts dispatched to more than one node."""
        self.exited_zero: dict[str, str] = {}
        """Job id -> node of an attempt the log assigned when it exited 0."""

    def after_event(self, event: ev.SchedulerEvent) -> None:
        if isinstance(event, ev.JobDispatched):
            self.dispatched[event.attempt_id] += 1
            if len(event.placements) > 1:
                self.spread.add(event.attempt_id)
            for placement in event.placements:
                incarnation = self.state.nodes[placement.node_id].incarnation
                agent = self.agents[placement.node_id]
                agent.inbox.append((event.job_id, event.attempt_id, incarnation))
                agent.sent_to[event.attempt_id] = incarnation
        elif isinstance(event, ev.NodeLost):
            # S5.7: a lost node's attempts are requeued; an exit its agent had not reported yet is void
            succeeded = {e.job_id for e in self.events if isinstance(e, ev.JobSucceeded)}
            for job_id, node_id in list(self.exited_zero.items()):
                if node_id == event.node_id and job_id not in succeeded:
                    del self.exited_zero[job_id]
        elif isinstance(event, ev.AttemptFenced):
            agent = self.agents[event.node_id]
            if agent.up and event.attempt_id in agent.attempts:
                # StopAttempt: the agent stops it and reports STOPPED (a late report: acknowledged)
                del agent.attempts[event.attempt_id]


class ReconcileMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.w = World()

    @initialize()
    def setup(self) -> None:
        w = self.w
        w.policy().environment_limits("se", {G5: 2 * SLOTS}).queue()
        w.share(share("qs").limit(2 * SLOTS).lend_and_borrow())
        for node_id in NODES:
            self._register(node_id, SLOTS)

    # ----- helpers ---------------------------------------------------------------------------------

    def _report(self, node_id: str, attempt: NodeAttempt) -> None:
        self.w.feed(
            inp.AttemptReport,
            node_id=node_id,
            job_id=attempt.job_id,
            attempt_id=attempt.attempt_id,
            status=attempt.status,
            exit_code=attempt.exit_code,
        )

    def _acknowledged(self, agent: Agent) -> None:
        """The scheduler recorded the node's list: the agent forgets the finished attempts in it."""
        for attempt_id in [a for a, att in agent.attempts.items() if att.status in OVER]:
            del agent.attempts[attempt_id]

    def _register(self, node_id: str, slots: int) -> None:
        agent = self.agents_of(node_id)
        agent.up = True
        agent.incarnation = f"{node_id}-{self.w.serial}-{len(self.w.events)}"
        self.w.feed(
            inp.RegisterNode,
            node_id=node_id,
            slots=slot_list(slots),
            attempts=agent.known(),
            incarnation=agent.incarnation,
        )
        self._acknowledged(agent)

    def _heartbeat(self, node_id: str) -> None:
        agent = self.agents_of(node_id)
        self.w.feed(inp.NodeHeartbeat, node_id=node_id, attempts=agent.known())
        if self.w.last and isinstance(self.w.last[0], ev.InputRejected):
            self._register(node_id, SLOTS)  # RegisterAgain

    def _flush(self, node_id: str) -> None:
        """The agent's outbox delivers the final reports it still holds; then it forgets them."""
        agent = self.agents_of(node_id)
        for attempt in agent.known():
            if attempt.status in OVER:
                self._report(node_id, attempt)
                del agent.attempts[attempt.attempt_id]

    def agents_of(self, node_id: str) -> Agent:
        return self.w.agents[node_id]

    # ----- rules -----------------------------------------------------------------------------------

    @rule(count=st.integers(1, 4), size=st.integers(1, 2))
    def submit(self, count: int, size: int) -> None:
        base = len(self.w.state.jobs) + len(self.w.dispatched) + self.w.serial
        for i in range(count):
            self.w.submit(job(f"j{base}-{i}").share("qs").needs(size))

    @rule(node_id=st.sampled_from(NODES), swallowed=st.booleans())
    def deliver(self, node_id: str, swallowed: bool) -> None:
        agent = self.agents_of(node_id)
        inbox, agent.inbox = agent.inbox, []
        if not agent.up:
            return  # commands for an agent that is down are lost
        for job_id, attempt_id, incarnation in inbox:
            if incarnation != agent.incarnation:
                continue  # dispatched before the agent's latest registration, which requeued it
            if attempt_id not in self.w.spread:
                # (a part of a spread attempt that a requeue ended may arrive after its job finished)
                record = self.w.state.jobs.get(job_id)
                assert (
                    record is not None
                    and record.attempt_id == attempt_id
                    and record.placements[0].node_id == node_id
                ), f"{node_id} starts {attempt_id}, which the log does not assign to it"
            attempt = NodeAttempt(job_id=job_id, attempt_id=attempt_id, status="STARTING")
            agent.attempts[attempt_id] = attempt
            if not swallowed:
                self._report(node_id, attempt)

    @rule(
        node_id=st.sampled_from(NODES),
        pick=st.integers(0, 100),
        status=st.sampled_from(["RUNNING", "SUCCEEDED", "SUCCEEDED", "FAILED"]),
        swallowed=st.booleans(),
    )
    def progress(self, node_id: str, pick: int, status: AttemptStatus, swallowed: bool) -> None:
        agent = self.agents_of(node_id)
        running = [a for a in agent.known() if a.status not in OVER]
        if not agent.up or not running:
            return
        attempt = running[pick % len(running)]
        exit_code = None if status == "RUNNING" else (0 if status == "SUCCEEDED" else 1)
        attempt = attempt.model_copy(update={"status": status, "exit_code": exit_code})
        agent.attempts[attempt.attempt_id] = attempt
        record = self.w.state.jobs.get(attempt.job_id)
        assigned = record is not None and record.attempt_id == attempt.attempt_id
        # (a gang with a lost member is requeued: S5.7)
        if exit_code == 0 and assigned and record is not None and len(record.placements) == 1:
            self.w.exited_zero[attempt.job_id] = node_id  # an attempt the log assigns exited 0
        if not swallowed:
            self._report(node_id, attempt)
            if status in OVER:
                del agent.attempts[attempt.attempt_id]

    @rule(node_id=st.sampled_from(NODES), processes_survive=st.booleans(), recorded=st.booleans())
    def crash(self, node_id: str, processes_survive: bool, recorded: bool = True) -> None:
        agent = self.agents_of(node_id)
        agent.up = False
        if not recorded:  # delivered, not on disk yet: forgotten, and its command is delivered again
            for attempt in [a for a in agent.known() if a.status == "STARTING"]:
                del agent.attempts[attempt.attempt_id]
                agent.inbox.append((attempt.job_id, attempt.attempt_id, agent.sent_to[attempt.attempt_id]))
        if not processes_survive:  # no exit file either: the attempts are simply gone
            agent.attempts = {a: att for a, att in agent.attempts.items() if att.status in OVER}

    @precondition(lambda self: any(not a.up for a in self.w.agents.values()))
    @rule(pick=st.integers(0, 1), slots=st.integers(1, SLOTS))
    def restart(self, pick: int, slots: int) -> None:
        down = [n for n in NODES if not self.agents_of(n).up]
        self._register(down[pick % len(down)], slots)

    @rule(node_id=st.sampled_from(NODES))
    def heartbeat(self, node_id: str) -> None:
        if self.agents_of(node_id).up:
            self._heartbeat(node_id)

    @rule(node_id=st.sampled_from(NODES))
    def flush(self, node_id: str) -> None:
        if self.agents_of(node_id).up:
            self._flush(node_id)

    @rule()
    def time_passes(self) -> None:
        for node_id in NODES:
            if self.agents_of(node_id).up:
                self._heartbeat(node_id)
        self.w.advance(20_000)
        self.w.feed(inp.Tick)

    # ----- invariants ------------------------------------------------------------------------------

    @invariant()
    def slots_used_once(self) -> None:
        check_slots(self.w.state)

    def teardown(self) -> None:
        w = self.w
        for node_id in NODES:
            if not self.agents_of(node_id).up:
                self._register(node_id, SLOTS)
        for _ in range(2):  # deliver, report what runs, reconcile: until nothing changes
            for node_id in NODES:
                self.deliver(node_id, swallowed=True)
                self._heartbeat(node_id)
                self._flush(node_id)
                self._register(node_id, SLOTS)
        check_slots(w.state)
        for record in w.state.jobs.values():
            over = {node_id for node_id, _ in record.parts_over}  # reported: held until every part ends
            for placement in (p for p in record.placements if p.node_id not in over):
                agent = self.agents_of(placement.node_id)
                assert record.attempt_id in agent.attempts, f"{record.attempt_id} holds slots, runs nowhere"
        for node_id in NODES:
            for attempt in self.agents_of(node_id).known():
                known = w.state.jobs.get(attempt.job_id)
                assert (
                    known is not None and known.attempt_id == attempt.attempt_id
                ), f"{node_id} runs {attempt.attempt_id}, which the log does not assign"
        assert all(n == 1 for n in w.dispatched.values()), "an attempt id was dispatched twice"
        succeeded = {e.job_id for e in w.events if isinstance(e, ev.JobSucceeded)}
        failed = {e.job_id for e in w.events if isinstance(e, ev.JobFailed)}
        assert not succeeded & failed
        for job_id in w.exited_zero:
            assert job_id in succeeded, f"{job_id} exited 0 but did not succeed"


def check_slots(state: ClusterState) -> None:
    """S7.1: every slot is used at most once, and free lists and pool counters agree."""
    holders: set[tuple[str, int]] = set()
    for record in state.jobs.values():
        for placement in record.placements:
            assert state.nodes[placement.node_id].online, f"{record.job_id} placed on a lost node"
            for slot in placement.slots:
                assert (placement.node_id, slot) not in holders, f"slot {placement.node_id}/{slot} used twice"
                assert slot < len(state.nodes[placement.node_id].slots), "a slot the node no longer has"
                holders.add((placement.node_id, slot))
    slots = free = 0
    for node in state.nodes.values():
        indices = set(range(len(node.slots)))
        busy = {i for i in indices if (node.node_id, i) in holders}
        assert set(node.free.get(G5, ())) == indices - busy, f"free slots of {node.node_id}"
        if node.usable:
            slots += len(indices)
            free += len(indices - busy)
    assert state.pool_slots.get("default", {}).get(G5, 0) == slots
    assert state.pool_free.get("default", {}).get(G5, 0) == free


ReconcileMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestReconcile = ReconcileMachine.TestCase


def test_an_exit_0_whose_report_a_crash_swallowed_succeeds_at_the_next_registration() -> None:
    machine = ReconcileMachine()
    machine.setup()
    machine.submit(count=1, size=1)
    (node_id,) = [n for n in NODES if machine.agents_of(n).inbox]
    machine.deliver(node_id, swallowed=False)
    machine.progress(node_id, pick=0, status="SUCCEEDED", swallowed=True)
    machine.crash(node_id, processes_survive=False)
    machine.restart(pick=0, slots=SLOTS)
    assert any(isinstance(e, ev.JobSucceeded) for e in machine.w.last)
    machine.teardown()


def test_a_node_back_with_fewer_slots_keeps_the_attempts_that_fit() -> None:
    machine = ReconcileMachine()
    machine.setup()
    machine.submit(count=4, size=1)
    for node_id in NODES:
        machine.deliver(node_id, swallowed=False)
    machine.crash("n0", processes_survive=True)
    machine.restart(pick=0, slots=1)
    requeued = [e for e in machine.w.last if isinstance(e, ev.JobRequeued)]
    fenced = [e for e in machine.w.last if isinstance(e, ev.AttemptFenced)]
    held = [j for j in machine.w.state.jobs.values() if any(p.node_id == "n0" for p in j.placements)]
    assert len(held) == 1 and held[0].placements[0].slots == (0,)
    assert {e.attempt_id for e in requeued} == {e.attempt_id for e in fenced} and requeued
    assert all(e.cause == "NODE_LOST" for e in requeued)
    machine.teardown()


def test_a_spread_part_arriving_after_its_job_finished_elsewhere_is_fenced() -> None:
    """A registration requeued a spread attempt; its job ran again and finished before the stale
    ``RunAttempt`` of the other part reached its node: the agent starts it, the scheduler fences it."""
    machine = ReconcileMachine()
    machine.setup()
    machine.submit(count=2, size=2)  # the second one spreads over n0 and n1
    machine.submit(count=1, size=1)
    (spread,) = machine.w.spread
    machine.crash("n0", processes_survive=False, recorded=False)
    machine.restart(pick=0, slots=SLOTS)  # requeues both attempts on n0, the spread one too
    machine.deliver("n0", swallowed=False)
    machine.progress("n0", pick=0, status="SUCCEEDED", swallowed=False)
    job_id = spread.split("#")[0]
    assert job_id not in machine.w.state.jobs
    before = len(machine.w.events)
    machine.deliver("n1", swallowed=False)
    fenced = [e for e in machine.w.events[before:] if isinstance(e, ev.AttemptFenced)]
    assert [(e.node_id, e.attempt_id) for e in fenced] == [("n1", spread)]
    assert spread not in machine.agents_of("n1").attempts
    machine.teardown()
