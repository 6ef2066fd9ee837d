"""Table-driven, multi-round scenarios for the scheduling core (semantics S2 to S6).

Each ``Case`` names the rules it pins down, builds a cluster, then plays rounds of inputs. After each
round the runner checks the named job statuses, *exactly* the preemptions and rejections of the round
(none unless listed), explain codes, share usage and further named checks. After the last round it
checks that folding the recorded events rebuilds the live state and that every event survives JSON.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuquota.core import fingerprint, replay
from gpuquota.core.blocked import (
    INSUFFICIENT_INSTANCE_CAPACITY,
    QUOTA_MANAGEMENT_LIMIT_EXCEEDED,
    SERVICE_ENVIRONMENT_MAX_RESOURCE,
    TIME_LIMIT_REASON,
)
from gpuquota.core.hygiene import MIN_RUNTIME_TAG as MIN_RUNTIME
from gpuquota.core.hygiene import REBORROW_BACKOFF_TAG as BACKOFF
from gpuquota.core.lifecycle import algorithm_error
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobQueueSpec, State
from gpuquota.wire.events import EVENT_ADAPTER
from tests.builders import (
    CROSS,
    G5,
    IN_SHARE,
    P4,
    Case,
    Harness,
    Round,
    ShareBuilder,
    do,
    expect,
    job,
    share,
)

SCHEDULED, RUNNING, RUNNABLE = "SCHEDULED", "RUNNING", "RUNNABLE"
QUOTA_LIMIT, SE_MAX, NO_NODES = (
    QUOTA_MANAGEMENT_LIMIT_EXCEEDED,
    SERVICE_ENVIRONMENT_MAX_RESOURCE,
    INSUFFICIENT_INSTANCE_CAPACITY,
)
SUCCEEDED, FAILED, REJECTED = "SUCCEEDED", "FAILED", "REJECTED"


def pool(
    capacity: int,
    *shares: ShareBuilder,
    nodes: int = 1,
    backfill: bool = False,
    time_limit: int | None = None,
) -> Callable[[], Harness]:
    """One SE of ``capacity`` g5 instances over ``nodes`` nodes, one queue ``jq``, the given shares."""
    return lambda: Harness.basic(capacity, nodes, backfill, time_limit).with_shares(*shares)


def big_and_small_nodes() -> Harness:
    h = Harness().policy().environment_limits("se", {G5: 6}).queue()
    h.node("big", ml_g5_xlarge=4).node("small", ml_g5_xlarge=2)
    return h.with_shares(share("QS1").limit(6))


def two_units() -> Harness:
    h = Harness().policy().environment_limits("se", {G5: 2, P4: 1}).queue()
    h.node("mixed", ml_g5_xlarge=2, ml_p4d_24xlarge=1)
    return h.with_shares(
        share("A").limit(1).limit(1, P4).lend_and_borrow(),
        share("B").limit(1).lend(),
    )


def two_environments_one_pool() -> Harness:
    h = Harness().policy()
    h.environment_limits("se1", {G5: 2}).environment_limits("se2", {G5: 2})
    h.queue("jq", environment="se1", priority=10).queue("jq2", environment="se2", priority=1)
    h.node("shared", ml_g5_xlarge=2)
    return h.with_shares(share("QS1").limit(2), share("S2").queue("jq2").limit(3))


def lab(name: str, limit: int = 1, borrow_limit: int = -1) -> ShareBuilder:
    return share(name).limit(limit).lend_and_borrow(borrow_limit)


def lend(name: str, limit: int = 1) -> ShareBuilder:
    return share(name).limit(limit).lend()


def reserve(name: str, limit: int = 1) -> ShareBuilder:
    return share(name).limit(limit).reserve()


# fmt: off
CASES: dict[str, Case] = {
    # ----- S8 as a table --------------------------------------------------------------------------
    "s8_worked_example": Case("S8, S2.4, S4.1, S4.2", Harness.worked_example, [
        Round([do.submit(job("high").priority(3), job("med").priority(2), job("low").priority(1))],
              want_status={"high": SCHEDULED, "med": SCHEDULED, "low": RUNNABLE},
              want_reason={"low": "IDLE_CAPACITY_RESERVED"},
              want=[expect.dispatch("high", "IN_QUOTA"), expect.dispatch("med", "BORROW", borrowed=1)]),
        Round([do.running("high", "med"), do.submit(job("q2").share("QS2").priority(1))],
              want_preempted=[("med", "q2", CROSS)], want_reason={"q2": "WAITING_FOR_PREEMPTION"}),
        Round([do.stop_all()], want_status={"med": RUNNABLE, "q2": SCHEDULED},
              want=[expect.preempted_count("med", 1), expect.dispatch("q2", "HOLD")]),
        Round([do.running("q2"), do.tag("q2", team="b"), do.set_priority("low", 4)],
              want_preempted=[("high", "low", IN_SHARE)]),
        Round([do.stop_all()],
              want_status={"high": RUNNABLE, "med": RUNNABLE, "low": SCHEDULED, "q2": RUNNING},
              want=[expect.reason("high", "Preempted (in-share): higher priority job low (priority 4 > 3)")]),
    ]),

    # ----- S2: strategies and accounting -------------------------------------------------------------
    "reserve_idle_never_lent": Case("S2.4", pool(2, reserve("R"), lab("B")), [
        Round([do.submit(job("b1").share("B"), job("b2").share("B"))],
              want_status={"b1": SCHEDULED, "b2": RUNNABLE}, want_reason={"b2": "IDLE_CAPACITY_RESERVED"},
              want_usage={"B": 1, "R": 0}),
        Round([do.submit(job("r1").share("R"))], want_status={"r1": SCHEDULED}, want_usage={"R": 1}),
        Round([do.succeed("r1")], want_status={"r1": SUCCEEDED, "b2": RUNNABLE},
              want_reason={"b2": "IDLE_CAPACITY_RESERVED"}),
        Round([do.succeed("b1")], want_status={"b2": SCHEDULED}, want=[expect.dispatch("b2", "IN_QUOTA")]),
    ]),
    "reserve_job_uses_own_reserve_in_full_pool": Case("S2.4, S2.5", Harness.worked_example, [
        Round([do.submit(job("high").priority(3), job("med").priority(2))],
              want_status={"high": SCHEDULED, "med": SCHEDULED}),
        # QS3's reserved instance is idle: its job runs there at once, nothing is preempted.
        Round([do.submit(job("r").share("QS3"))], want_status={"r": SCHEDULED},
              want_usage={"QS1": 2, "QS3": 1}),
    ]),
    "reserve_job_reclaims_after_capacity_loss": Case("S2.4, S4.1, S4.5", pool(3, lab("A"), reserve("R")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("a3").share("A"))],
              want_status={"a1": SCHEDULED, "a2": SCHEDULED, "a3": RUNNABLE},
              want_reason={"a3": "IDLE_CAPACITY_RESERVED"}),
        Round([do.se_limits("se", {G5: 2})], want_status={"a1": SCHEDULED, "a2": SCHEDULED}),
        Round([do.submit(job("r1").share("R"))], want_preempted=[("a2", "r1", CROSS)]),
        Round([do.stop_all()], want_status={"r1": SCHEDULED, "a2": RUNNABLE, "a3": RUNNABLE},
              want_usage={"A": 1, "R": 1}, want_reason={"a2": "NO_IDLE_CAPACITY"}),
    ]),
    "raised_reserve_limit_is_its_own_to_use": Case("S2.4, S4.5", pool(3, lab("A"), reserve("R")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"))], want_usage={"A": 2}),
        # R's reservation now exceeds the idle capacity: r1 fits without preemption (R's reserve is
        # its own); r2 is in quota too and reclaims A's borrowed instance.
        Round([do.update_share(reserve("R", 2)), do.submit(job("r1").share("R")),
               do.submit(job("r2").share("R"))],
              want_status={"r1": SCHEDULED, "r2": RUNNABLE}, want_preempted=[("a2", "r2", CROSS)]),
        Round([do.stop_all()], want_status={"r2": SCHEDULED, "a2": RUNNABLE}),
    ]),
    "overcommitted_reservations_serve_own_jobs": Case("S2.4, S2.5, S7.7",
                                                      pool(2, reserve("R1", 2), reserve("R2")), [
        # Reservations (2 + 1) exceed the capacity (2); a share's own reserve never blocks its jobs.
        Round([do.submit(job("r1").share("R1"))], want_status={"r1": SCHEDULED}),
        # The other idle instance is reserved by both shares: neither may take it from the other.
        Round([do.submit(job("r2").share("R1"), job("q1").share("R2"))],
              want_status={"r2": RUNNABLE, "q1": RUNNABLE},
              want_reason={"r2": "WAITING_FOR_OWN_QUOTA", "q1": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.succeed("r1")], want_status={"r2": SCHEDULED, "q1": RUNNABLE}),
    ]),
    "lend_never_borrows": Case("S2.3", pool(3, lend("L"), lab("B")), [
        Round([do.submit(job("l1").share("L"), job("l2").share("L"))],
              want_status={"l1": SCHEDULED, "l2": RUNNABLE}, want_reason={"l2": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.submit(job("b1").share("B"), job("b2").share("B"), job("b3").share("B"))],
              want_status={"b1": SCHEDULED, "b2": SCHEDULED, "b3": RUNNABLE},
              want_reason={"b3": "NO_IDLE_CAPACITY", "l2": "WAITING_FOR_OWN_QUOTA"},
              want_usage={"L": 1, "B": 2}),
    ]),
    "lend_idle_is_lent_then_reclaimed": Case("S2.3, S4.1", pool(2, lend("L"), lab("B")), [
        Round([do.submit(job("b1").share("B"), job("b2").share("B"))],
              want_status={"b1": SCHEDULED, "b2": SCHEDULED}, want_usage={"B": 2},
              want=[expect.dispatch("b2", "BORROW", borrowed=1)]),
        Round([do.running("b1", "b2"), do.submit(job("l1").share("L"))],
              want_preempted=[("b2", "l1", CROSS)], want_status={"b2": RUNNING, "l1": RUNNABLE},
              want_reason={"l1": "WAITING_FOR_PREEMPTION"}, want=[expect.stopping("b2")]),
        Round([do.stop_all()], want_status={"l1": SCHEDULED, "b2": RUNNABLE, "b1": RUNNING},
              want=[expect.reason("b2", "Preempted (cross-share): capacity reclaimed by quota share L "
                                        "for job l1"),
                    expect.preempted_count("b2", 1), expect.failures("b2", 0)]),
    ]),
    "borrow_limit_zero": Case("S2.3", pool(4, lab("B", 2, 0), lend("L", 2)), [
        Round([do.submit(job("b1").share("B"), job("b2").share("B"), job("b3").share("B"))],
              want_status={"b1": SCHEDULED, "b2": SCHEDULED, "b3": RUNNABLE},
              want_reason={"b3": "BORROW_LIMIT_REACHED"}),
    ]),
    "borrow_limit_50_percent_floors": Case("S2.3", pool(8, lab("B", 3, 50), lab("S", 1, 50), lend("L", 4)), [
        # M = 3 + floor(1.5) = 4 for B; M = 1 + floor(0.5) = 1 for S.
        Round([do.submit(*(job(f"b{i}").share("B") for i in range(1, 6)))],
              want_status={"b4": SCHEDULED, "b5": RUNNABLE}, want_usage={"B": 4},
              want_reason={"b5": "BORROW_LIMIT_REACHED"}),
        Round([do.submit(job("s1").share("S"), job("s2").share("S"))],
              want_status={"s1": SCHEDULED, "s2": RUNNABLE}, want_reason={"s2": "BORROW_LIMIT_REACHED"}),
    ]),
    "borrow_limit_200_percent": Case("S2.3", pool(6, lab("B", 1, 200), lend("L", 5)), [
        Round([do.submit(*(job(f"b{i}").share("B") for i in range(1, 5)))],
              want_status={"b3": SCHEDULED, "b4": RUNNABLE}, want_usage={"B": 3},
              want_reason={"b4": "BORROW_LIMIT_REACHED"}),
    ]),
    "borrow_limit_unlimited": Case("S2.3", pool(5, lab("B", 1, -1), lend("L", 4)), [
        Round([do.submit(*(job(f"b{i}").share("B") for i in range(1, 7)))],
              want_status={"b5": SCHEDULED, "b6": RUNNABLE}, want_usage={"B": 5},
              want_reason={"b6": "NO_IDLE_CAPACITY"}),
    ]),
    "uncovered_se_capacity_is_borrowable": Case("S2.5", pool(4, lab("B"), lend("L")), [
        Round([do.submit(job("b1").share("B").needs(3))], want_status={"b1": SCHEDULED},
              want=[expect.dispatch("b1", "BORROW", borrowed=2)]),
        Round([do.submit(job("l1").share("L"), job("l2").share("L"))],
              want_status={"l1": SCHEDULED, "l2": RUNNABLE}, want_reason={"l2": "WAITING_FOR_OWN_QUOTA"}),
    ]),
    "overcommitted_pool_waits_without_preemption": Case("S2.5, S4.1", pool(2, lend("A", 2), lend("B", 2)), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("b1").share("B"),
                         job("a3").share("A"))],
              want_status={"a1": SCHEDULED, "a2": SCHEDULED, "b1": RUNNABLE, "a3": RUNNABLE},
              want_reason={"b1": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.succeed("a1")], want_status={"b1": SCHEDULED, "a3": RUNNABLE}),
    ]),
    "several_capacity_units": Case("S2, S6", two_units, [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("ap").share("A").needs(1, P4))],
              want_status={"a1": SCHEDULED, "a2": SCHEDULED, "ap": SCHEDULED},
              want=[expect.placement("ap", ("mixed", (2,), (2,))), expect.usage("A", 1, P4),
                    expect.usage("A", 2)]),
        Round([do.submit(job("bp").share("B").needs(1, P4))], want_status={"bp": REJECTED},
              want_rejected=["has no capacity limit for instance type ml.p4d.24xlarge"]),
        Round([do.submit(job("b1").share("B"))], want_preempted=[("a2", "b1", CROSS)],
              want=[expect.usage("A", 1, P4)]),
        Round([do.stop_all(), do.submit(job("ap2").share("A").needs(1, P4))],
              want_status={"b1": SCHEDULED, "ap": SCHEDULED, "ap2": RUNNABLE, "a2": RUNNABLE},
              want_reason={"a2": "NO_IDLE_CAPACITY", "ap2": "BEHIND_SHARE_HEAD"}),
        # One queue per share across units: ap2 waits behind a2 (S3.2), then needs A's p4 limit.
        Round([do.succeed("a1")], want_status={"a2": SCHEDULED, "ap2": RUNNABLE},
              want_reason={"ap2": "NO_IDLE_CAPACITY"}),
    ]),

    # ----- S3: ordering ------------------------------------------------------------------------------
    "in_quota_phase_oldest_head_across_shares": Case("S3.3.1", pool(1, lend("X"), lend("A"), lend("B")), [
        Round([do.submit(job("x1").share("X"), job("b1").share("B"), job("a1").share("A").priority(9))],
              want_status={"x1": SCHEDULED, "b1": RUNNABLE, "a1": RUNNABLE}),
        # Priority orders jobs within a share only: b1's head is older than a1's.
        Round([do.succeed("x1")], want_status={"b1": SCHEDULED, "a1": RUNNABLE}),
    ]),
    "share_order_priority_then_created_at": Case("S3.1", pool(1, lend("QS1")), [
        Round([do.submit(job("x"), job("low").priority(1), job("hi").priority(5), job("hi2").priority(5))],
              want_status={"x": SCHEDULED, "low": RUNNABLE, "hi": RUNNABLE, "hi2": RUNNABLE},
              want_reason={"hi": "WAITING_FOR_OWN_QUOTA", "hi2": "BEHIND_SHARE_HEAD",
                           "low": "BEHIND_SHARE_HEAD"}),
        Round([do.succeed("x")], want_status={"hi": SCHEDULED, "hi2": RUNNABLE}),
        Round([do.succeed("hi")], want_status={"hi2": SCHEDULED, "low": RUNNABLE}),
        Round([do.succeed("hi2")], want_status={"low": SCHEDULED}),
    ]),
    "borrow_phase_is_fifo": Case("S3.3.2", pool(3, lab("A"), lab("B"), lend("L")), [
        Round([do.submit(job("a0").share("A"), job("b0").share("B"), job("l0").share("L"),
                         job("b1").share("B"), job("a1").share("A").priority(9))],
              want_status={"b1": RUNNABLE, "a1": RUNNABLE}, want_reason={"b1": "NO_IDLE_CAPACITY"}),
        Round([do.succeed("l0")], want_status={"b1": SCHEDULED, "a1": RUNNABLE},
              want=[expect.dispatch("b1", "BORROW", borrowed=1)]),
    ]),
    "in_quota_phase_before_borrow_phase": Case("S3.3", pool(2, lab("A"), lab("B")), [
        Round([do.submit(job("a1").share("A"), job("b1").share("B"), job("a2").share("A"),
                         job("b2").share("B"))],
              want_status={"a1": SCHEDULED, "b1": SCHEDULED, "a2": RUNNABLE, "b2": RUNNABLE}),
        # a2 (a borrower) is older, but b2 is in quota now and the in-quota phase comes first.
        Round([do.succeed("b1")], want_status={"b2": SCHEDULED, "a2": RUNNABLE},
              want=[expect.dispatch("b2", "IN_QUOTA")]),
    ]),
    "strict_share_order_head_blocks": Case("S3.2", pool(4, lend("A", 4), lend("B")), [
        Round([do.submit(job("a1").share("A").needs(3), job("a2").share("A").needs(2),
                         job("a3").share("A"))],
              want_status={"a1": SCHEDULED, "a2": RUNNABLE, "a3": RUNNABLE},
              want_reason={"a2": "WAITING_FOR_OWN_QUOTA", "a3": "BEHIND_SHARE_HEAD"}),
        # Other shares are not blocked by A's head.
        Round([do.submit(job("b1").share("B"))], want_status={"b1": SCHEDULED, "a3": RUNNABLE}),
    ]),
    "backfill_policy_lets_later_jobs_run": Case("S3.2 (backfill)", pool(4, lend("A", 4), backfill=True), [
        Round([do.submit(job("a1").share("A").needs(3), job("a2").share("A").needs(2),
                         job("a3").share("A"))],
              want_status={"a1": SCHEDULED, "a2": RUNNABLE, "a3": SCHEDULED}),
        Round([do.succeed("a1")], want_status={"a2": SCHEDULED}),
    ]),

    # ----- S4.1: cross-share reclaim -----------------------------------------------------------------
    "reclaim_is_priority_independent": Case("S4.1", pool(2, lab("A"), lend("B")), [
        Round([do.submit(job("a1").share("A").priority(9), job("a2").share("A").priority(9))],
              want_status={"a1": SCHEDULED, "a2": SCHEDULED}),
        Round([do.submit(job("b1").share("B").priority(1))], want_preempted=[("a2", "b1", CROSS)],
              want=[expect.stopping("a2")]),
        Round([do.stop_all()], want_status={"b1": SCHEDULED, "a2": RUNNABLE, "a1": SCHEDULED},
              want=[expect.reason("a2", "capacity reclaimed by quota share B for job b1")]),
    ]),
    "reclaim_victim_order": Case("S4.1", pool(3, lab("A"), lend("B", 2)), [
        Round([do.submit(job("a2").share("A").priority(1)), do.submit(job("a1").share("A").priority(5)),
               do.submit(job("a3").share("A").priority(5))],
              want_status={"a1": SCHEDULED, "a2": SCHEDULED, "a3": SCHEDULED}),
        # Lowest priority first, although a2 was dispatched first.
        Round([do.submit(job("b1").share("B"))], want_preempted=[("a2", "b1", CROSS)]),
        # Then, among equal priorities, the most recently dispatched.
        Round([do.stop_all(), do.submit(job("b2").share("B"))], want_preempted=[("a3", "b2", CROSS)]),
        Round([do.stop_all()], want_status={"b1": SCHEDULED, "b2": SCHEDULED, "a1": SCHEDULED,
                                             "a2": RUNNABLE, "a3": RUNNABLE}),
    ]),
    "reclaim_only_while_victim_share_borrows": Case("S4.1", pool(4, lab("A"), lab("X"), lend("D", 2)), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("x1").share("X").priority(5),
                         job("x2").share("X").priority(5))],
              want_usage={"A": 2, "X": 2}),
        # a1 (priority 0) precedes x2 in victim order, but A stops borrowing once a2 is gone.
        Round([do.submit(job("d1").share("D").needs(2))],
              want_preempted=[("a2", "d1", CROSS), ("x2", "d1", CROSS)]),
        Round([do.stop_all()], want_status={"d1": SCHEDULED, "a1": SCHEDULED, "x1": SCHEDULED}),
    ]),
    "reclaim_puts_back_unneeded_victims": Case("S4.1", pool(4, lab("A"), lend("B", 3)), [
        Round([do.submit(job("a0").share("A").priority(9), job("big").share("A").priority(1).needs(2),
                         job("small").share("A"))],
              want_status={"a0": SCHEDULED, "big": SCHEDULED, "small": SCHEDULED}),
        # small is removed first but big alone suffices, so small is put back.
        Round([do.submit(job("b1").share("B").needs(2))], want_preempted=[("big", "b1", CROSS)]),
        Round([do.stop_all()], want_status={"b1": SCHEDULED, "small": SCHEDULED, "big": RUNNABLE}),
    ]),
    "no_pointless_reclaim": Case("S4.1", pool(3, lab("A"), lend("X"), lend("B", 2)), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("x1").share("X"))],
              want_usage={"A": 2, "X": 1}),
        # Only a2 is borrowed; freeing it would not make room for 2 instances: preempt nothing.
        Round([do.submit(job("b1").share("B").needs(2))], want_status={"b1": RUNNABLE, "a2": SCHEDULED},
              want_reason={"b1": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.succeed("x1")], want_preempted=[("a2", "b1", CROSS)]),
        Round([do.stop_all()], want_status={"b1": SCHEDULED, "a2": RUNNABLE}),
    ]),

    # ----- S4.2: in-share preemption -----------------------------------------------------------------
    "in_share_strictly_lower_priority_only": Case("S4.2", pool(2, lend("A", 2).in_share_preemption()), [
        Round([do.submit(job("a1").share("A").priority(5), job("a2").share("A").priority(3))],
              want_status={"a1": SCHEDULED, "a2": SCHEDULED}),
        Round([do.submit(job("a3").share("A").priority(5))], want_preempted=[("a2", "a3", IN_SHARE)]),
        Round([do.stop_all()], want_status={"a3": SCHEDULED, "a2": RUNNABLE},
              want=[expect.reason("a2", "Preempted (in-share): higher priority job a3 (priority 5 > 3)")]),
        # a1 and a3 have priority 5: equal priority never preempts.
        Round([do.submit(job("a4").share("A").priority(5))], want_status={"a4": RUNNABLE},
              want_reason={"a4": "WAITING_FOR_OWN_QUOTA", "a2": "BEHIND_SHARE_HEAD"}),
    ]),
    "in_share_equal_priority_never": Case("S4.2", pool(1, lend("A").in_share_preemption()), [
        Round([do.submit(job("a1").share("A").priority(3), job("a2").share("A").priority(3))],
              want_status={"a1": SCHEDULED, "a2": RUNNABLE}),
        Round([do.elapse(1_000)], want_status={"a1": SCHEDULED, "a2": RUNNABLE}),
    ]),
    "in_share_disabled_waits": Case("S4.2", pool(1, lend("A")), [
        Round([do.submit(job("a1").share("A").priority(1), job("a2").share("A").priority(9))],
              want_status={"a1": SCHEDULED, "a2": RUNNABLE}, want_reason={"a2": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.succeed("a1")], want_status={"a2": SCHEDULED}),
    ]),
    "in_share_victim_order_and_put_back": Case("S4.2", pool(4, lend("A", 4).in_share_preemption()), [
        Round([do.submit(job("a1").share("A").priority(1)),
               do.submit(job("a2").share("A").priority(2).needs(2)),
               do.submit(job("a3").share("A").priority(1))],
              want_usage={"A": 4}),
        Round([do.submit(job("hi").share("A").priority(9))], want_preempted=[("a3", "hi", IN_SHARE)]),
        Round([do.stop_all()], want_status={"hi": SCHEDULED, "a3": RUNNABLE}),
        # a1 is removed first but a2 alone frees 2: a1 is put back.
        Round([do.submit(job("hi2").share("A").priority(9).needs(2))],
              want_preempted=[("a2", "hi2", IN_SHARE)]),
        Round([do.stop_all()], want_status={"hi2": SCHEDULED, "a1": SCHEDULED, "a2": RUNNABLE}),
    ]),
    "in_share_for_borrowing_head": Case("S4.2, S3.3.4", pool(2, lab("A").in_share_preemption(), lend("L")), [
        Round([do.submit(job("a1").share("A").priority(1), job("a2").share("A").priority(1))],
              want_usage={"A": 2}),
        # a3 is over A's own limit; the borrow phase has nothing idle, in-share preemption frees a2.
        Round([do.submit(job("a3").share("A").priority(7))], want_preempted=[("a2", "a3", IN_SHARE)]),
        Round([do.stop_all()], want_status={"a3": SCHEDULED, "a2": RUNNABLE},
              want=[expect.dispatch("a3", "HOLD", borrowed=1)]),
    ]),

    # ----- S4.3: holds --------------------------------------------------------------------------------
    "hold_freed_capacity_no_repeated_preemption": Case("S4.3", pool(3, lab("A"), lend("B"), lend("D")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("a3").share("A"))],
              want_usage={"A": 3}),
        Round([do.submit(job("b1").share("B"))], want_preempted=[("a3", "b1", CROSS)],
              want_reason={"b1": "WAITING_FOR_PREEMPTION"}),
        # While a3 stops: more inputs, no new victims for b1, and nobody takes the held capacity.
        Round([do.set_priority("b1", 5), do.elapse(1_000), do.submit(job("a4").share("A").priority(9))],
              want_status={"a4": RUNNABLE, "b1": RUNNABLE}, want_reason={"b1": "WAITING_FOR_PREEMPTION"}),
        # Another share's preemptor picks a new victim; a3 (already stopping) is not chosen twice.
        Round([do.submit(job("d1").share("D"))], want_preempted=[("a2", "d1", CROSS)]),
        Round([do.stopped("a3")], want_status={"b1": SCHEDULED, "d1": RUNNABLE, "a4": RUNNABLE},
              want=[expect.dispatch("b1", "HOLD")]),
        Round([do.stopped("a2")], want_status={"d1": SCHEDULED, "a4": RUNNABLE, "a2": RUNNABLE}),
    ]),
    "hold_when_victim_finishes_by_itself": Case("S4.3", Harness.worked_example, [
        Round([do.submit(job("high").priority(3), job("med").priority(2)), do.running("high", "med"),
               do.submit(job("q2").share("QS2"))],
              want_preempted=[("med", "q2", CROSS)]),
        Round([do.succeed("med")], want_status={"med": SUCCEEDED, "q2": SCHEDULED}),
    ]),
    "hold_ends_when_preemptor_terminated": Case("S4.3, S5.6", pool(2, lab("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A")), do.running("a1", "a2"),
               do.submit(job("b1").share("B"))],
              want_preempted=[("a2", "b1", CROSS)]),
        Round([do.terminate("b1")], want_status={"b1": FAILED, "a2": RUNNING},
              want=[expect.terminated("b1"), expect.stopping("a2")]),
        # a2 stops (preempted) and, nobody needing the capacity any more, borrows it again.
        Round([do.stopped("a2")], want_status={"a2": SCHEDULED},
              want=[expect.attempt("a2", 2), expect.preempted_count("a2", 1)]),
    ]),

    "hold_released_when_preemptor_still_does_not_fit": Case("S4.3, S4.5", pool(2, lab("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A")), do.running("a1", "a2"),
               do.submit(job("b1").share("B"))],
              want_preempted=[("a2", "b1", CROSS)]),
        # The SE shrinks while a2 stops: once it has stopped, b1 still does not fit; its hold ends
        # and, A no longer borrowing, b1 waits without a new preemption.
        Round([do.se_limits("se", {G5: 1}), do.stopped("a2")],
              want_status={"a2": RUNNABLE, "b1": RUNNABLE}, want_reason={"b1": "WAITING_FOR_OWN_QUOTA"},
              want=[expect.that("hold released", lambda h: "b1" not in h.state.holds)]),
        Round([do.succeed("a1")], want_status={"a2": SCHEDULED, "b1": RUNNABLE}),
    ]),

    # ----- S4.4: preemption retries ---------------------------------------------------------------------
    "preemption_retries_zero": Case("S4.4", pool(2, lab("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("v").share("A").preemption_retries(0)),
               do.submit(job("b1").share("B"))],
              want_preempted=[("v", "b1", CROSS)]),
        Round([do.stop_all()], want_status={"v": FAILED, "b1": SCHEDULED},
              want=[expect.reason("v", "preemption retries exhausted (0)")]),
    ]),
    "preemption_retries_two": Case("S4.4", pool(2, lab("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("v").share("A").preemption_retries(2)),
               do.submit(job("b1").share("B")), do.stop_all()],
              want_preempted=[("v", "b1", CROSS)], want_status={"v": RUNNABLE},
              want=[expect.preempted_count("v", 1)]),
        Round([do.succeed("b1"), do.submit(job("b2").share("B")), do.stop_all()],
              want_preempted=[("v", "b2", CROSS)], want_status={"v": RUNNABLE},
              want=[expect.preempted_count("v", 2), expect.dispatch_count("v", 2)]),
        Round([do.succeed("b2"), do.submit(job("b3").share("B")), do.stop_all()],
              want_preempted=[("v", "b3", CROSS)], want_status={"v": FAILED, "b3": SCHEDULED},
              want=[expect.reason("v", "preemption retries exhausted (2)")]),
    ]),
    "preemption_retries_unset_requeues_forever": Case("S4.4", pool(2, lab("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("v").share("A")),
               do.submit(job("b1").share("B")), do.stop_all(),
               do.succeed("b1"), do.submit(job("b2").share("B")), do.stop_all(),
               do.succeed("b2"), do.submit(job("b3").share("B")), do.stop_all()],
              want_preempted=[("v", "b1", CROSS), ("v", "b2", CROSS), ("v", "b3", CROSS)],
              want_status={"v": RUNNABLE},
              want=[expect.preempted_count("v", 3), expect.failures("v", 0)]),
        # Preemption consumed no retry attempt (retryStrategy.attempts = 1).
        Round([do.succeed("b3")], want_status={"v": SCHEDULED}, want=[expect.attempt("v", 4)]),
    ]),

    # ----- S4.5: lowered limits -------------------------------------------------------------------------
    "lowered_share_limit_preempts_nothing_by_itself": Case("S4.5", pool(2, lend("A", 2), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"))], want_usage={"A": 2}),
        Round([do.update_share(lend("A", 1))], want_status={"a1": SCHEDULED, "a2": SCHEDULED}),
        Round([do.submit(job("a3").share("A"))], want_status={"a3": RUNNABLE},
              want_reason={"a3": "WAITING_FOR_OWN_QUOTA"}),
        # A is now above its limit: its most recent job is reclaimable for B.
        Round([do.submit(job("b1").share("B"))], want_preempted=[("a2", "b1", CROSS)]),
        Round([do.stop_all()], want_status={"b1": SCHEDULED, "a2": RUNNABLE, "a3": RUNNABLE}),
    ]),
    "lowered_reserve_limit_makes_jobs_reclaimable": Case("S4.5", pool(2, reserve("R", 2), lend("B")), [
        Round([do.submit(job("r1").share("R"), job("r2").share("R"), job("b1").share("B"))],
              want_status={"r1": SCHEDULED, "r2": SCHEDULED, "b1": RUNNABLE},
              want_reason={"b1": "WAITING_FOR_OWN_QUOTA"}),
        # The lowered limit makes r2 borrowed; b1 already waits in quota, so it reclaims r2 now.
        Round([do.update_share(reserve("R", 1))], want_preempted=[("r2", "b1", CROSS)]),
    ]),
    "lowered_borrow_limit_respected_at_once": Case("S4.5", pool(6, lab("A", 2, 100), lend("L", 4)), [
        Round([do.submit(*(job(f"a{i}").share("A") for i in range(1, 4)))], want_usage={"A": 3}),
        Round([do.update_share(lab("A", 1, 100)), do.submit(job("a4").share("A"))],
              want_status={"a3": SCHEDULED, "a4": RUNNABLE}, want_reason={"a4": "BORROW_LIMIT_REACHED"}),
    ]),
    "lowered_se_limit": Case("S4.5, S2.1", pool(4, lab("A"), lend("B")), [
        Round([do.submit(*(job(f"a{i}").share("A") for i in range(1, 5)))], want_usage={"A": 4}),
        Round([do.se_limits("se", {G5: 2})], want_usage={"A": 4}),
        Round([do.submit(job("b1").share("B"))],
              want_preempted=[("a4", "b1", CROSS), ("a3", "b1", CROSS), ("a2", "b1", CROSS)]),
        Round([do.stop_all()], want_status={"b1": SCHEDULED, "a2": RUNNABLE}, want_usage={"A": 1, "B": 1}),
        Round([do.succeed("a1")], want_status={"a2": SCHEDULED, "a3": RUNNABLE},
              want_reason={"a3": "NO_IDLE_CAPACITY"}),
    ]),
    "disabled_service_environment_dispatches_nothing": Case("S2.1", pool(2, lend("A", 2)), [
        Round([do.se_limits("se", {G5: 2}, state=State.DISABLED), do.submit(job("a1").share("A"))],
              want_status={"a1": RUNNABLE}, want_reason={"a1": "SERVICE_ENVIRONMENT_DISABLED"}),
        Round([do.se_limits("se", {G5: 2})], want_status={"a1": SCHEDULED}),
    ]),

    # ----- S4.6: priority updates -----------------------------------------------------------------------
    "priority_update_reorders_runnable": Case("S4.6", pool(1, lend("QS1")), [
        Round([do.submit(job("x"), job("a1").priority(1), job("a2").priority(1)),
               do.set_priority("a2", 5)],
              want_reason={"a1": "BEHIND_SHARE_HEAD", "a2": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.succeed("x")], want_status={"a2": SCHEDULED, "a1": RUNNABLE}),
    ]),
    "priority_update_of_dispatched_job_changes_victim": Case("S4.6, S4.1", pool(3, lab("A"), lend("B")), [
        Round([do.submit(*(job(f"a{i}").share("A") for i in range(1, 4))), do.set_priority("a3", 9)],
              want_usage={"A": 3}),
        Round([do.submit(job("b1").share("B"))], want_preempted=[("a2", "b1", CROSS)]),
    ]),
    "priority_update_protects_from_in_share": Case("S4.6, S4.2",
                                                   pool(2, lend("A", 2).in_share_preemption()), [
        Round([do.submit(job("a1").share("A").priority(1), job("a2").share("A").priority(1)),
               do.set_priority("a1", 8)]),
        Round([do.submit(job("hi").share("A").priority(5))], want_preempted=[("a2", "hi", IN_SHARE)]),
    ]),

    # ----- S5: lifecycle --------------------------------------------------------------------------------
    "retry_without_rules_until_attempts_exhausted": Case("S5.4", pool(1, lend("QS1")), [
        Round([do.submit(job("j").retries(3)), do.running("j"), do.fail("j")],
              want_status={"j": SCHEDULED}, want=[expect.attempt("j", 2), expect.failures("j", 1)]),
        Round([do.running("j"), do.fail("j")], want_status={"j": SCHEDULED}, want=[expect.attempt("j", 3)]),
        Round([do.running("j"), do.fail("j", algorithm_error("exited with code 3"))],
              want_status={"j": FAILED}, want=[expect.reason("j", "exited with code 3")]),
    ]),
    "evaluate_on_exit_first_match_wins": Case("S5.4", pool(4, lend("QS1", 4)), [
        Round([do.submit(job("oom").retries(3, ("EXIT", "*OutOfMemory*"), ("RETRY", "*")),
                         job("other").retries(3, ("EXIT", "*OutOfMemory*"), ("RETRY", "*")),
                         job("nomatch").retries(3, ("EXIT", "Host*")),
                         job("host").retries(2, ("RETRY", "Host*"), ("EXIT", "*"))),
               do.running("oom", "other", "nomatch", "host")]),
        Round([do.fail("oom", "OutOfMemoryError: Container killed"), do.fail("other", "exit 1"),
               do.fail("nomatch", "exit 1"), do.fail("host", "Host EC2 (instance i-1) terminated.")],
              want_status={"oom": FAILED, "other": SCHEDULED, "nomatch": SCHEDULED, "host": SCHEDULED}),
        # Attempts are exhausted whatever the rules say.
        Round([do.running("host"), do.fail("host", "Host EC2 (instance i-2) terminated.")],
              want_status={"host": FAILED}),
    ]),
    "attempt_timeout_counts_from_running": Case("S5.5", pool(1, lend("QS1")), [
        Round([do.submit(job("j").timeout(60).retries(2)), do.elapse(100_000)], want_status={"j": SCHEDULED},
              want=[expect.that("no stop", lambda h: not h.stopping("j"))]),
        Round([do.running("j"), do.elapse(59_000)], want_status={"j": RUNNING},
              want=[expect.that("no stop", lambda h: not h.stopping("j"))]),
        Round([do.elapse(2_000)], want_status={"j": RUNNING}, want=[expect.stopping("j")]),
        Round([do.stopped("j")], want_status={"j": SCHEDULED},
              want=[expect.attempt("j", 2), expect.failures("j", 1)]),
        Round([do.running("j"), do.elapse(61_000), do.stopped("j")], want_status={"j": FAILED},
              want=[expect.reason("j", "Attempt duration exceeded")]),
    ]),
    "terminate_runnable_fails_at_once": Case("S5.6", pool(1, lend("QS1")), [
        Round([do.submit(job("a1"), job("a2"), job("a3")), do.terminate("a2", "Not needed")],
              want_status={"a1": SCHEDULED, "a2": FAILED, "a3": RUNNABLE},
              want_reason={"a3": "WAITING_FOR_OWN_QUOTA"},
              want=[expect.terminated("a2"), expect.reason("a2", "Not needed")]),
        Round([do.terminate("a2")], want_rejected=["Job a2 does not exist or has finished"]),
    ]),
    "terminate_running_releases_on_stop_report": Case("S5.6", pool(1, lend("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("b1").share("B")), do.running("a1")],
              want_status={"a1": RUNNING, "b1": RUNNABLE}),
        Round([do.terminate("a1", "user cancel"), do.terminate("a1")],
              want_status={"a1": RUNNING, "b1": RUNNABLE}, want=[expect.stopping("a1")]),
        Round([do.stopped("a1")], want_status={"a1": FAILED, "b1": SCHEDULED},
              want=[expect.terminated("a1"), expect.reason("a1", "user cancel")]),
    ]),
    "node_lost_by_missed_heartbeats": Case("S5.7", pool(4, lend("QS1", 4), nodes=2), [
        Round([do.submit(job("a1").needs(2), job("a2")), do.running("a1", "a2")],
              want=[expect.placement("a1", ("node-0", (0, 1), (0, 1))),
                    expect.placement("a2", ("node-1", (0,), (0,)))]),
        Round([do.elapse(38_000, silent=["node-0"])], want_status={"a1": RUNNABLE, "a2": RUNNING},
              want_reason={"a1": "WAITING_FOR_OWN_QUOTA"},
              want=[expect.reason("a1", "Node node-0 lost"), expect.failures("a1", 0),
                    expect.preempted_count("a1", 0)]),
        # Late reports from the lost node: a running attempt is fenced, a finished one ignored.
        Round([do.report("node-0", "a1", "a1#1", "RUNNING")], want=[expect.last_events("AttemptFenced")]),
        Round([do.report("node-0", "a1", "a1#1", "SUCCEEDED")], want_status={"a1": RUNNABLE},
              want=[expect.last_events()]),
        Round([do.heartbeat("node-0")], want_rejected=["Node node-0 is not registered"]),
        Round([do.register("node-0", ml_g5_xlarge=2)], want_status={"a1": SCHEDULED},
              want=[expect.attempt("a1", 2),
                    expect.placement("a1", ("node-1", (1,), (1,)), ("node-0", (0,), (0,)))]),
    ]),
    # Full disruption: every node of the pool silent at once is a broken link, not lost nodes. The
    # first heartbeat restarts every timer; a node that stays silent is lost a whole timeout later.
    "full_disruption_suspends_node_loss": Case("S5.7", pool(2, lend("QS1", 2), nodes=2), [
        Round([do.submit(job("a1"), job("a2")), do.running("a1", "a2")],
              want=[expect.placement("a1", ("node-0", (0,), (0,))),
                    expect.placement("a2", ("node-1", (0,), (0,)))]),
        Round([do.elapse(120_000, silent=["node-0", "node-1"])], want_status={"a1": RUNNING, "a2": RUNNING}),
        Round([do.heartbeat("node-1")], want=[expect.last_events("NodeHeartbeatRecorded")]),
        Round([do.tick()], want=[expect.last_events("NodeLossResumed")]),
        Round([do.elapse(30_000, silent=["node-0"])], want_status={"a1": RUNNING, "a2": RUNNING}),
        Round([do.elapse(15_000, silent=["node-0"])], want_status={"a1": RUNNABLE, "a2": RUNNING},
              want=[expect.reason("a1", "Node node-0 lost")]),
    ]),
    "deregistered_node_requeues_without_counts": Case("S5.7", pool(2, lend("QS1", 2), nodes=2), [
        Round([do.submit(job("j").preemption_retries(0)), do.running("j")],
              want=[expect.placement("j", ("node-0", (0,), (0,)))]),
        Round([do.deregister("node-0")], want_status={"j": SCHEDULED},
              want=[expect.attempt("j", 2), expect.placement("j", ("node-1", (0,), (0,))),
                    expect.failures("j", 0), expect.preempted_count("j", 0)]),
        Round([do.report("node-0", "j", "j#1", "STOPPED")], want=[expect.last_events()]),
        Round([do.report("node-0", "j", "j#1", "STARTING")], want=[expect.last_events("AttemptFenced")]),
        Round([do.running("j"), do.succeed("j")], want_status={"j": SUCCEEDED}),
    ]),
    "drained_node_keeps_running_jobs": Case("S2.1", pool(4, lend("QS1", 4), nodes=2), [
        Round([do.submit(job("a1").needs(2)), do.running("a1"), do.drain("node-0")],
              want_status={"a1": RUNNING}),
        Round([do.submit(job("a2"))], want_status={"a2": RUNNABLE},
              want_reason={"a2": "WAITING_FOR_OWN_QUOTA"}),
        Round([do.succeed("a1")], want_status={"a2": SCHEDULED},
              want=[expect.placement("a2", ("node-1", (0,), (0,)))]),
        Round([do.submit(job("a3").needs(2))], want_status={"a3": RUNNABLE}),
        Round([do.undrain("node-0")], want_status={"a3": SCHEDULED},
              want=[expect.placement("a3", ("node-1", (1,), (1,)), ("node-0", (0,), (0,)))]),
    ]),
    "time_limit_fails_only_blocked_heads": Case("S9.1, S9.2", pool(2, lend("QS1"), lab("B"), time_limit=60), [
        # a2 only waits its turn (its share is at its limit): not blocked, never timed out.
        Round([do.submit(job("a1"), job("a2")), do.running("a1"), do.elapse(120_000)],
              want_status={"a1": RUNNING, "a2": RUNNABLE}, want_reason={"a2": "WAITING_FOR_OWN_QUOTA"},
              want=[expect.blocked("a2", None)]),
        # big can never fit QS1 (limit 1, LEND): blocked at the head, its clock starts now.
        Round([do.submit(job("big").needs(2).priority(5)), do.elapse(59_000)],
              want_status={"big": RUNNABLE, "a2": RUNNABLE},
              want_reason={"big": QUOTA_LIMIT, "a2": "BEHIND_BLOCKED_HEAD"},
              want=[expect.blocked("big", QUOTA_LIMIT)]),
        Round([do.elapse(2_000)], want_status={"big": FAILED, "a2": RUNNABLE, "a1": RUNNING},
              want=[expect.reason("big", TIME_LIMIT_REASON.format(code=QUOTA_LIMIT)),
                    expect.terminated("big"), expect.blocked("a2", None)]),
        # A LEND_AND_BORROW share with an unbounded borrow limit is blocked only by the SE's limit.
        Round([do.submit(job("b3").share("B").needs(3)), do.elapse(61_000)],
              want_status={"b3": RUNNABLE}, want_reason={"b3": SE_MAX},
              want=[expect.blocked("b3", SE_MAX)]),
    ]),
    "blocked_by_missing_nodes_until_they_come": Case("S9.1", pool(2, lend("QS1", 2), nodes=2), [
        Round([do.deregister("node-1"), do.submit(job("a").needs(2))], want_status={"a": RUNNABLE},
              want_reason={"a": NO_NODES}, want=[expect.blocked("a", NO_NODES)]),
        Round([do.register("node-1", ml_g5_xlarge=1)], want_status={"a": SCHEDULED},
              want=[expect.blocked("a", None),
                    expect.last_events("NodeRegistered", "JobDispatched", "JobUnblocked")]),
    ]),
    "queue_deletion_takes_its_shares": Case("S5.9", pool(1, lend("A"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A"), job("b1").share("B")), do.running("a1"),
               do.feed(inp.DeleteJobQueue, name="jq")],
              want_rejected=["Job queue jq must be DISABLED before it is deleted"]),
        Round([do.feed(inp.UpdateJobQueue, spec=JobQueueSpec(
                   name="jq", service_environment="se", scheduling_policy="policy", state=State.DISABLED)),
               do.feed(inp.DeleteJobQueue, name="jq")],
              want_status={"a1": RUNNING, "a2": FAILED, "b1": FAILED},
              want=[expect.reason("a2", "Job queue jq deleted"), expect.stopping("a1"),
                    expect.share_gone("B"),
                    expect.that("jq is deleting", lambda h: "jq" in h.state.queues_deleting)]),
        Round([do.submit(job("late").share("A")), do.feed(inp.DeleteJobQueue, name="jq")],
              want_status={"late": REJECTED}, want_rejected=["is DISABLED", "does not exist"]),
        Round([do.stopped("a1")], want_status={"a1": FAILED},
              want=[expect.share_gone("A"), expect.that("jq is gone", lambda h: "jq" not in h.state.queues)]),
    ]),
    # ----- S10: preemption hygiene (opt-in) ----------------------------------------------------------------
    "min_runtime_delays_a_reclaim": Case("S10.1", pool(2, lab("A").tag(MIN_RUNTIME, "60"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A")), do.running("a1", "a2")],
              want_status={"a1": RUNNING, "a2": RUNNING}, want_usage={"A": 2}),
        # a2 borrows B's instance but has run less than 60 s: b1 waits, and explain says until when.
        Round([do.submit(job("b1").share("B"))], want_status={"b1": RUNNABLE},
              want_reason={"b1": "WAITING_FOR_MIN_RUNTIME"},
              want=[expect.that("b1 waits 60 s", lambda h: (h.waits_until("b1") or 0) - h.now > 55_000)]),
        Round([do.elapse(45_000)], want_status={"b1": RUNNABLE}),
        Round([do.elapse(16_000)], want_preempted=[("a2", "b1", CROSS)]),
    ]),
    "min_runtime_guards_in_share_victims": Case("S10.1", pool(
            1, lend("A").tag(MIN_RUNTIME, "30").in_share_preemption()), [
        Round([do.submit(job("low").share("A").priority(1)), do.running("low"),
               do.submit(job("high").share("A").priority(5))], want_status={"high": RUNNABLE}),
        Round([do.elapse(31_000)], want_preempted=[("low", "high", IN_SHARE)]),
    ]),
    "reborrow_backoff_after_a_reclaim": Case("S10.2", pool(2, lab("A").tag(BACKOFF, "30"), lend("B")), [
        Round([do.submit(job("a1").share("A"), job("a2").share("A")), do.running("a1", "a2"),
               do.submit(job("b1").share("B"))], want_preempted=[("a2", "b1", CROSS)]),
        Round([do.stop_all(), do.running("b1"), do.succeed("b1")],
              want_status={"a2": RUNNABLE, "b1": SUCCEEDED}, want_reason={"a2": "REBORROW_BACKOFF"}),
        Round([do.elapse(31_000)], want_status={"a2": SCHEDULED}),
        # Reclaimed again within 10 x 30 s: the backoff doubles to 60 s.
        Round([do.running("a2"), do.submit(job("b2").share("B"))], want_preempted=[("a2", "b2", CROSS)]),
        Round([do.stop_all(), do.running("b2"), do.succeed("b2"), do.elapse(31_000)],
              want_status={"a2": RUNNABLE}, want_reason={"a2": "REBORROW_BACKOFF"}),
        Round([do.elapse(30_000)], want_status={"a2": SCHEDULED}),
    ]),
    "hygiene_tags_are_validated": Case("S10", pool(1, lend("A")), [
        Round([do.update_share(lend("A").tag(MIN_RUNTIME, "soon"))],
              want_rejected=["Tag gpuquota:minRuntimeSeconds must be a whole number of seconds"]),
    ]),
    "share_deletion_rules": Case("S5.9", pool(1, lend("A"), lend("B")), [
        Round([do.submit(job("b1").share("B"), job("b2").share("B"), job("a1").share("A"),
                         job("b3").share("B"))],
              want_status={"b1": SCHEDULED, "b2": RUNNABLE, "a1": RUNNABLE, "b3": RUNNABLE}),
        Round([do.delete_share("B")], want_rejected=["must be DISABLED before it is deleted"]),
        Round([do.update_share(lend("B").disabled()), do.submit(job("b4").share("B"))],
              want_rejected=["Quota share B is DISABLED"], want_status={"b4": REJECTED}),
        # A DISABLED share still runs its queued jobs (b2's head is older than a1).
        Round([do.succeed("b1")], want_status={"b2": SCHEDULED, "a1": RUNNABLE}),
        Round([do.running("b2"), do.delete_share("B")], want_status={"b2": RUNNING, "b3": FAILED},
              want=[expect.reason("b3", "Quota share B deleted"), expect.terminated("b3"),
                    expect.stopping("b2")]),
        Round([do.stopped("b2")], want_status={"b2": FAILED, "a1": SCHEDULED},
              want=[expect.reason("b2", "Quota share B deleted"), expect.share_gone("B")]),
        Round([do.submit(job("b5").share("B"))], want_rejected=["Quota share B does not exist"]),
    ]),
    "node_reports_are_idempotent": Case("S5.3", pool(1, lend("QS1")), [
        Round([do.submit(job("a1")), do.starting("a1"), do.starting("a1")],
              want_status={"a1": "STARTING"}, want=[expect.last_events()]),
        Round([do.running("a1"), do.starting("a1")], want_status={"a1": RUNNING},
              want=[expect.last_events()]),
        Round([do.succeed("a1")], want_status={"a1": SUCCEEDED}),
    ]),
    "attempt_handed_back_is_requeued": Case("S5", pool(1, lend("QS1")), [
        Round([do.submit(job("a1")), do.stopped("a1")], want_status={"a1": SCHEDULED},
              want=[expect.attempt("a1", 2), expect.failures("a1", 0), expect.preempted_count("a1", 0)]),
    ]),

    # ----- S6: placement --------------------------------------------------------------------------------
    "gang_job_spans_nodes_fullest_first": Case("S6", pool(6, lend("QS1", 6), nodes=3), [
        Round([do.submit(job("x"))], want=[expect.placement("x", ("node-0", (0,), (0,)))]),
        Round([do.submit(job("g").needs(4))],
              want=[expect.placement("g", ("node-0", (1,), (1,)), ("node-1", (0, 1), (0, 1)),
                                     ("node-2", (0,), (0,)))]),
        Round([do.submit(job("big").needs(2))], want_status={"big": RUNNABLE}),
        Round([do.running("g"), do.succeed("g")], want_status={"g": SUCCEEDED, "big": SCHEDULED},
              want=[expect.placement("big", ("node-0", (1,), (1,)), ("node-1", (0,), (0,)))]),
    ]),
    "placement_prefers_fullest_node": Case("S6", big_and_small_nodes, [
        Round([do.submit(job("x"))], want=[expect.placement("x", ("small", (0,), (0,)))]),
        Round([do.submit(job("y").needs(2))],
              want=[expect.placement("y", ("small", (1,), (1,)), ("big", (0,), (0,)))]),
        Round([do.submit(job("z").needs(3))], want=[expect.placement("z", ("big", (1, 2, 3), (1, 2, 3)))]),
        Round([do.submit(job("w"))], want_status={"w": RUNNABLE}, want_reason={"w": "WAITING_FOR_OWN_QUOTA"}),
    ]),
    "node_reregistered_with_fewer_slots": Case("S6, S7.1", pool(4, lend("QS1", 4)), [
        Round([do.register("node-0", ml_g5_xlarge=2), do.register("node-1", ml_g5_xlarge=2),
               do.submit(job("a"), job("b"), job("c").needs(2))],
              want=[expect.placement("c", ("node-1", (0, 1), (0, 1)))]),
        Round([do.succeed("a", "b"), do.submit(job("e"))],
              want=[expect.placement("e", ("node-0", (0,), (0,)))]),
        Round([do.submit(job("f"), job("g"))], want_status={"f": SCHEDULED, "g": RUNNABLE}),
    ]),

    # ----- S1: two service environments in one pool -----------------------------------------------------
    "two_service_environments_share_a_pool": Case("S1, S2.1", two_environments_one_pool, [
        Round([do.submit(job("x1").queue("jq2").share("S2"), job("x2").queue("jq2").share("S2"))],
              want_status={"x1": SCHEDULED, "x2": SCHEDULED}),
        Round([do.submit(job("x3").queue("jq2").share("S2"), job("a1").share("QS1"))],
              want_status={"x3": RUNNABLE, "a1": RUNNABLE}, want_reason={"a1": "NO_CAPACITY_FOR_UNIT"}),
        # x3 is older, but se1's job queue has the higher priority.
        Round([do.succeed("x1")], want_status={"a1": SCHEDULED, "x3": RUNNABLE}),
    ]),

    # ----- bad input --------------------------------------------------------------------------------------
    "bad_inputs_are_rejected": Case("S1, S5.7", Harness.worked_example, [
        # ranges (a priority, a borrowLimit only for LEND_AND_BORROW) are the wire models' to check
        # (tests/unit/test_rule_homes.py): the core sees only valid inputs and checks business rules
        Round([do.submit(job("u").share("NOPE"), job("q").queue("nojq")),
               do.set_priority("nobody", 1), do.terminate("nobody")],
              want_status={"u": REJECTED, "q": REJECTED},
              want_rejected=["Quota share NOPE does not exist", "Job queue nojq does not exist",
                             "Job nobody does not exist", "Job nobody does not exist"]),
        Round([do.submit(job("a").share("QS2"), job("a").share("QS1"))],
              want_status={"a": SCHEDULED},
              want_rejected=["Job a already exists"]),
        # a clientToken's retry names the job its first try made (the gateway derives the id from
        # the token): it is answered by that job, neither rejected nor made twice
        Round([do.submit(job("t").share("QS2").token("tok")), do.submit(job("t").share("QS2").token("tok"))],
              want_status={"t": RUNNABLE}, want=[expect.last_events()]),
        Round([do.report("node-x", "a", "a#1", "RUNNING"), do.heartbeat("node-x"), do.drain("node-x"),
               do.deregister("node-x"), do.delete_share("NOPE"),
               do.feed(inp.UpdateQuotaShare, spec=share("NOPE").limit(1).build())],
              want_status={"a": SCHEDULED},
              want_rejected=["Attempt a#1 is not placed on node node-x", "Node node-x is not registered",
                             "Node node-x is not registered", "Node node-x is not registered",
                             "Quota share NOPE does not exist", "Quota share NOPE does not exist"]),
        Round([do.report("node-0", "a", "a#7", "RUNNING")], want=[expect.last_events("AttemptFenced")],
              want_status={"a": SCHEDULED}),
    ]),
}
# fmt: on


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_scenario(case: Case) -> None:
    h = case.setup()
    for number, round_ in enumerate(case.rounds, start=1):
        mark = len(h.events)
        for action in round_.actions:
            action(h)
        events = h.events[mark:]
        where = f"round {number}: {list(round_.actions)}"

        assert {j: h.status(j) for j in round_.want_status} == dict(round_.want_status), where
        preempted = [(e.job_id, e.preemptor_job_id, e.kind) for e in events if isinstance(e, ev.JobPreempted)]
        assert preempted == list(round_.want_preempted), where
        rejected = [e.reason for e in events if isinstance(e, ev.InputRejected)]
        assert len(rejected) == len(round_.want_rejected), f"{where}: {rejected}"
        for want, got in zip(round_.want_rejected, rejected, strict=True):
            assert want in got, f"{where}: {got!r} lacks {want!r}"
        assert {j: h.explain(j) for j in round_.want_reason} == dict(round_.want_reason), where
        assert {s: h.usage(s) for s in round_.want_usage} == dict(round_.want_usage), where
        for check in round_.want:
            assert check.holds(h), f"{where}: {check}"

    assert fingerprint(replay(h.events, h.state.heartbeat_timeout_ms)) == fingerprint(h.state)
    for event in h.events:
        assert EVENT_ADAPTER.validate_json(event.model_dump_json()) == event


def test_every_case_pins_down_an_outcome() -> None:
    """A case whose rounds expect nothing but the default (no preemption, no rejection) could pass
    whatever the core decides: each must name a status, reason, usage, preemption, rejection or check."""
    for name, case in CASES.items():
        expects = [
            r.want_status or r.want_reason or r.want_usage or r.want_preempted or r.want_rejected or r.want
            for r in case.rounds
        ]
        assert any(expects), f"{name} ({case.rules}) expects no outcome"


def test_node_with_a_recent_heartbeat_is_not_lost() -> None:
    h = Harness.basic(capacity=2)
    h.share(lend("QS1", 2))
    h.advance(10_000).heartbeat("node-0")  # recorded (10 s >= 30 s / 4)
    h.advance(5_000).heartbeat("node-0")  # 5 s later: not recorded
    h.tick(26_000)  # 26 s after the last heartbeat, 31 s after the last recorded one
    assert h.state.nodes["node-0"].online


def test_a_lost_node_heartbeating_again_is_asked_to_register_again() -> None:
    h = Harness.basic(capacity=2, nodes=2)
    h.share(lend("QS1", 2))
    h.submit(job("a1")).running("a1")
    (placed,) = h.placement("a1")
    lost_node = placed[0]
    other = "node-1" if lost_node == "node-0" else "node-0"
    h.elapse(38_000, silent=[lost_node])
    assert not h.state.nodes[lost_node].online
    # S5.7: the lost node's attempt was requeued and runs elsewhere
    assert h.placement("a1") == [(other, (0,), (0,))] and h.record("a1").attempt_number == 2
    # the agent is alive and heartbeats again: rejected, naming the node (the shells answer RegisterAgain)
    (rejected,) = h.feed(inp.NodeHeartbeat, node_id=lost_node)
    assert isinstance(rejected, ev.InputRejected)
    assert (rejected.input_type, rejected.node_id, rejected.job_id) == ("NodeHeartbeat", lost_node, None)
    assert rejected.reason == f"Node {lost_node} is not registered; register it again"
    # a node the scheduler never knew: the same
    (unknown,) = h.feed(inp.NodeHeartbeat, node_id="stranger")
    assert isinstance(unknown, ev.InputRejected) and unknown.node_id == "stranger"
    # other rejections name no node
    (other_rejection,) = h.feed(inp.DrainNode, node_id="stranger")
    assert isinstance(other_rejection, ev.InputRejected) and other_rejection.node_id is None
    # the agent registers again and re-reports its stale attempt: fenced
    h.node(lost_node, ml_g5_xlarge=1)
    assert h.state.nodes[lost_node].online
    h.report_attempt(lost_node, "a1", "a1#1", "RUNNING")
    (fenced,) = h.last
    assert isinstance(fenced, ev.AttemptFenced) and (fenced.node_id, fenced.attempt_id) == (lost_node, "a1#1")
    assert h.feed(inp.NodeHeartbeat, node_id=lost_node) == []  # registered: nothing to reject
