"""S12: checkpoints reported by nodes, the work each preemption loses, and the leastLostWork order."""

from __future__ import annotations

import pytest

from gpuquota.core import fingerprint, replay
from gpuquota.core.checkpoints import LEAST_LOST_WORK, VICTIM_ORDER_TAG
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SchedulingPolicySpec
from tests.builders import Harness, ShareBuilder, job, share


def borrowing(victim_order: str | None) -> Harness:
    """A borrows 2 of B's 3 instances with a1 (older) and a2 (newer, so AWS's first victim); both run
    and a1 has a checkpoint of 10 s ago while a2 has none, 60 s into their attempts."""
    a = share("A").limit(1).lend_and_borrow()
    b: ShareBuilder = share("B").limit(2)
    if victim_order is not None:
        b.tag(VICTIM_ORDER_TAG, victim_order)
    h = Harness.basic(3, 1).with_shares(a, b)
    h.submit(job("a0").share("A"), job("a1").share("A"), job("a2").share("A")).running("a0", "a1", "a2")
    h.advance(60_000)
    h.report("a1", "RUNNING", checkpoint_at=h.now - 10_000)
    h.advance(1_000)
    return h


def preempted(h: Harness) -> list[ev.JobPreempted]:
    return [e for e in h.last if isinstance(e, ev.JobPreempted)]


def test_aws_order_by_default_takes_the_most_recently_dispatched() -> None:
    h = borrowing(None)
    h.submit(job("b1").share("B"))
    (victim,) = preempted(h)
    assert victim.job_id == "a2"
    started_at = h.state.jobs["a2"].started_at
    assert started_at is not None
    assert victim.lost_ms == h.now - started_at  # no checkpoint: since its start
    assert victim.lost_gpus == 1


def test_least_lost_work_takes_the_job_that_checkpointed_last() -> None:
    h = borrowing(LEAST_LOST_WORK)
    h.submit(job("b1").share("B"))
    (victim,) = preempted(h)
    assert victim.job_id == "a1"
    assert 11_000 <= victim.lost_ms <= 11_010  # since its checkpoint, not its start
    assert fingerprint(replay(h.events)) == fingerprint(h.state)


def test_a_larger_demand_takes_the_victims_that_lose_the_least_together() -> None:
    h = borrowing(LEAST_LOST_WORK)
    h.report("a0", "RUNNING", checkpoint_at=h.now)  # it would lose nothing
    h.submit(job("b1").share("B").needs(2))
    assert {e.job_id for e in preempted(h)} == {"a0", "a1"}


def test_checkpoints_from_heartbeats_are_recorded_once_and_never_move_back() -> None:
    h = borrowing(None)
    attempt = h.state.jobs["a2"].attempt_id
    assert attempt is not None

    def beat(at: int) -> list[ev.SchedulerEvent]:
        known = inp.NodeAttempt(job_id="a2", attempt_id=attempt, status="RUNNING", checkpoint_at=at)
        others = [
            inp.NodeAttempt(job_id=j, attempt_id=h.state.jobs[j].attempt_id or "", status="RUNNING")
            for j in ("a0", "a1")
        ]
        return h.feed(inp.NodeHeartbeat, node_id="node-0", attempts=(known, *others))

    first = [e for e in beat(h.now - 5_000) if isinstance(e, ev.AttemptCheckpointed)]
    assert [e.job_id for e in first] == ["a2"]
    assert not [e for e in beat(h.now - 7_000) if isinstance(e, ev.AttemptCheckpointed)]  # older
    future = [e for e in beat(h.now + 3_600_000) if isinstance(e, ev.AttemptCheckpointed)]
    assert [e.checkpoint_at for e in future] == [h.now]  # a clock ahead: taken as now
    assert h.state.jobs["a2"].checkpoint_at == h.now


def test_a_checkpoint_of_another_attempt_or_node_is_ignored() -> None:
    h = borrowing(None)
    h.feed(
        inp.AttemptReport, node_id="node-0", job_id="a2", attempt_id="a2#9", status="RUNNING", checkpoint_at=1
    )
    assert not [e for e in h.last if isinstance(e, ev.AttemptCheckpointed)]
    assert h.state.jobs["a2"].checkpoint_at is None


def test_a_checkpoint_before_the_attempt_started_saves_nothing_of_it() -> None:
    h = borrowing(LEAST_LOST_WORK)
    started = h.state.jobs["a2"].started_at
    assert started is not None
    h.report("a2", "RUNNING", checkpoint_at=started - 1_000)  # left by an earlier attempt
    h.report("a1", "RUNNING", checkpoint_at=started + 1)
    h.submit(job("b1").share("B"))
    (victim,) = preempted(h)
    assert victim.job_id == "a1"


@pytest.mark.parametrize("value", ["leastlostwork", "", "fifo"])
def test_an_unknown_victim_order_is_refused(value: str) -> None:
    h = Harness.basic(1, 1)
    h.share(share("A").limit(1).tag(VICTIM_ORDER_TAG, value))
    (rejected,) = h.last
    assert isinstance(rejected, ev.InputRejected) and VICTIM_ORDER_TAG in rejected.reason


def played_with_checkpoints() -> Harness:
    """A run with ``AttemptCheckpointed`` and a leastLostWork preemption (the contract tests' sample)."""
    h = borrowing(LEAST_LOST_WORK)
    return h.submit(job("b1").share("B"))


def test_the_scheduling_policy_opts_every_share_in_unless_the_share_says_otherwise() -> None:
    for share_tag, expected in ((None, "a1"), ("aws", "a2")):
        h = borrowing(share_tag)
        policy = SchedulingPolicySpec(name="policy", tags={VICTIM_ORDER_TAG: LEAST_LOST_WORK})
        h.feed(inp.UpdateSchedulingPolicy, spec=policy)
        h.submit(job("b1").share("B"))
        assert [e.job_id for e in preempted(h)] == [expected]
