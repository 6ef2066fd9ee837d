"""S12: the S7 invariants with every share on ``gpuquota:victimOrder=leastLostWork`` and random checkpoint
reports, plus S12's own: the order the search takes is a permutation of AWS's allowed candidates,
sorted by the work each would lose, ties in AWS's order."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from gpuquota.core.checkpoints import LEAST_LOST_WORK, VICTIM_ORDER_TAG, lost_gpu_ms, victim_order
from gpuquota.core.preemption import cross_share_candidates, in_share_candidates
from gpuquota.core.quota import Ledger
from gpuquota.wire import events as ev
from tests.builders import Harness, ShareBuilder
from tests.property.test_invariants import CheckedHarness, SchedulerMachine, machine_settings


class OrderedHarness(CheckedHarness):
    """Every share opts in; each preemption decision is checked against AWS's candidate list."""

    def share(self, builder: ShareBuilder) -> Harness:
        return super().share(builder.tag(VICTIM_ORDER_TAG, LEAST_LOST_WORK))

    def before_event(self, event: ev.SchedulerEvent) -> None:
        super().before_event(event)
        if isinstance(event, ev.JobPreempted):
            check_order(self, event)


def check_order(h: Harness, event: ev.JobPreempted) -> None:
    state = h.state
    preemptor = state.jobs[event.preemptor_job_id]
    queue = state.queues[preemptor.share[0]]
    ledger = Ledger(state, state.environments[queue.service_environment])
    find = cross_share_candidates if event.kind == "CROSS_SHARE" else in_share_candidates
    aws = list(find(ledger, preemptor)[0])
    ordered = list(victim_order(state, preemptor, iter(list(aws)), event.occurred_at))
    assert sorted(ordered) == sorted(aws), "S12: the order is not a permutation of AWS's candidates"
    assert any(key[2] == event.job_id for key in aws), "S12: a victim outside AWS's allowed set"
    lost = [lost_gpu_ms(state.jobs[key[2]], event.occurred_at) for key in ordered]
    assert lost == sorted(lost), "S12: victims not in order of the work they lose"
    for i in range(len(ordered) - 1):
        tie = lost[i] == lost[i + 1]
        assert not tie or aws.index(ordered[i]) < aws.index(ordered[i + 1]), "S12: a tie not in AWS's order"


class VictimOrderMachine(SchedulerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = OrderedHarness()

    @precondition(lambda self: any(j.status.value == "RUNNING" for j in self.h.state.jobs.values()))
    @rule(pick=st.integers(0, 10_000), ago=st.sampled_from([0, 1_000, 30_000, 120_000]))
    def checkpoint(self, pick: int, ago: int) -> None:
        """A running job's node reports a checkpoint ``ago`` ms before now (possibly before its start)."""
        running = [j for j in self.live() if j.status.value == "RUNNING"]
        record = running[pick % len(running)]
        self.h.report(record.job_id, "RUNNING", checkpoint_at=self.h.now - ago)


VictimOrderMachine.TestCase.settings = machine_settings(150)
TestInvariantsWithLeastLostWork = VictimOrderMachine.TestCase
