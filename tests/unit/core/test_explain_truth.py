"""``explain`` tells the truth (issue #29, point 4): one case per message kind, with the exact message
and action, and the figures it prints checked against the state; S9.1's ``statusReason`` for every
job that can never run, wherever it waits, recorded in the log and rebuilt by a replay."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuquota.core import evolve, fingerprint, replay
from gpuquota.core.blocked import SERVICE_ENVIRONMENT_MAX_RESOURCE as SE_MAX
from gpuquota.core.explain import explain
from gpuquota.core.hygiene import MIN_RUNTIME_TAG, REBORROW_BACKOFF_TAG
from gpuquota.read.model import ReadModel
from gpuquota.wire import events as ev
from gpuquota.wire.base import State
from tests.builders import G5, Harness, ShareBuilder, job, share

Scenario = Callable[[], tuple[Harness, str]]


def basic(capacity: int, nodes: int, *shares: ShareBuilder) -> Harness:
    return Harness.basic(capacity, nodes).with_shares(*shares)


def behind_share_head() -> tuple[Harness, str]:
    h = basic(1, 1, share("A").limit(1))
    return h.submit(job("a1").share("A"), job("a2").share("A"), job("a3").share("A")), "a3"


def behind_blocked_head() -> tuple[Harness, str]:
    h = basic(3, 1, share("A").limit(1))
    return h.submit(job("never").share("A").needs(2).priority(5), job("fits").share("A")), "fits"


def behind_head_without_nodes() -> tuple[Harness, str]:
    h = basic(3, 1, share("A").limit(3)).deregister("node-0").node("node-1", ml_g5_xlarge=1)
    return h.submit(job("wide").share("A").needs(2).priority(5), job("one").share("A")), "one"


def blocked_behind_the_head() -> tuple[Harness, str]:
    h = basic(3, 1, share("A").limit(3).lend_and_borrow())
    h.submit(job("run").share("A").needs(3), job("head").share("A"), job("big").share("A").needs(4))
    return h, "big"


def waiting_for_preemption() -> tuple[Harness, str]:
    h = basic(2, 1, share("A").limit(1).lend_and_borrow(), share("B").limit(1))
    h.submit(job("a1").share("A"), job("a2").share("A")).running("a1", "a2")
    return h.submit(job("b1").share("B")), "b1"


def environment_disabled() -> tuple[Harness, str]:
    h = basic(2, 1, share("A").limit(1)).environment_limits("se", {G5: 2}, state=State.DISABLED)
    return h.submit(job("a1").share("A")), "a1"


def head_over_a_lend_share() -> tuple[Harness, str]:
    return basic(3, 1, share("A").limit(1)).submit(job("a").share("A").needs(2)), "a"


def head_over_a_borrowing_share() -> tuple[Harness, str]:
    return basic(3, 1, share("A").limit(1).lend_and_borrow(100)).submit(job("a").share("A").needs(3)), "a"


def head_over_the_environment() -> tuple[Harness, str]:
    return basic(3, 1, share("A").limit(1).lend_and_borrow()).submit(job("a").share("A").needs(4)), "a"


def head_without_nodes() -> tuple[Harness, str]:
    h = basic(3, 3, share("A").limit(3)).deregister("node-2")
    return h.submit(job("a").share("A").needs(3)), "a"


def no_capacity_for_unit() -> tuple[Harness, str]:
    h = Harness().policy().environment_limits("se1", {G5: 2}).environment_limits("se2", {G5: 2})
    h.queue("jq", environment="se1", priority=10).queue("jq2", environment="se2", priority=1)
    h.node("shared", ml_g5_xlarge=2).with_shares(share("QS1").limit(2), share("S2").queue("jq2").limit(3))
    h.submit(job("x1").queue("jq2").share("S2"), job("x2").queue("jq2").share("S2"))
    return h.submit(job("a1").share("QS1")), "a1"


def pool_full() -> tuple[Harness, str]:
    h = basic(2, 1, share("A").limit(2), share("B").limit(2))
    return h.submit(job("a").share("A").needs(2), job("b").share("B")), "b"


def reserve_share_over_its_limit() -> tuple[Harness, str]:
    h = basic(3, 1, share("R").limit(3).reserve())
    return h.submit(job("r1").share("R").needs(2), job("r2").share("R").needs(2)), "r2"


def borrow_limit_reached() -> tuple[Harness, str]:
    h = basic(4, 1, share("A").limit(1).lend_and_borrow(100), share("B").limit(3))
    return h.submit(job("a1").share("A").needs(2), job("a2").share("A")), "a2"


def idle_capacity_reserved() -> tuple[Harness, str]:
    h = basic(2, 1, share("A").limit(1).lend_and_borrow(), share("R").limit(1).reserve())
    return h.submit(job("a1").share("A"), job("a2").share("A")), "a2"


def too_little_idle() -> tuple[Harness, str]:
    h = basic(4, 1, share("A").limit(1).lend_and_borrow(), share("B").limit(3))
    h.submit(job("b1").share("B"), job("a1").share("A").needs(2))
    return h.submit(job("a2").share("A").needs(2)), "a2"


def min_runtime() -> tuple[Harness, str]:
    h = basic(2, 1, share("A").limit(1).lend_and_borrow().tag(MIN_RUNTIME_TAG, "60"), share("B").limit(1))
    h.submit(job("a1").share("A"), job("a2").share("A")).running("a1", "a2")
    return h.submit(job("b1").share("B")), "b1"


def reborrow_backoff() -> tuple[Harness, str]:
    h = basic(
        2, 1, share("A").limit(1).lend_and_borrow().tag(REBORROW_BACKOFF_TAG, "30"), share("B").limit(1)
    )
    h.submit(job("a1").share("A"), job("a2").share("A")).running("a1", "a2").submit(job("b1").share("B"))
    return h.stop_all_preempted().running("b1").succeed("b1"), "a2"


def ready() -> tuple[Harness, str]:
    """Between an input and its pass (a shell's state as it applies the events one by one)."""
    h = basic(1, 1, share("A").limit(1))
    evolve(h.state, ev.JobAccepted(event_id="x/0", occurred_at=h.now, job=job("a").share("A").build(h.now)))
    return h, "a"


def dispatched() -> tuple[Harness, str]:
    return basic(1, 1, share("A").limit(1)).submit(job("a").share("A")), "a"


def stopping() -> tuple[Harness, str]:
    return basic(1, 1, share("A").limit(1)).submit(job("a").share("A")).terminate("a", "not needed"), "a"


QUOTA = "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
RAISE_A = (
    "raise quota share A's limit for ml.g5.xlarge to at least 2 "
    "(or make it LEND_AND_BORROW with a borrowLimit)"
)
WAIT = "Wait for running jobs to finish"
# fmt: off
KINDS: dict[str, tuple[Scenario, str, str, str]] = {
    "behind the head": (behind_share_head, "BEHIND_SHARE_HEAD",
        "1 job(s) ahead in quota share A; head is a2",
        "Wait for the job(s) ahead to start or raise this job's priority above a2's (0)"),
    "behind a head that can never run": (behind_blocked_head, "BEHIND_BLOCKED_HEAD",
        "Quota share A is blocked by job never (head of the share, which can never start as configured: it "
        "needs 2 ml.g5.xlarge but quota share A may hold at most 1); 1 job(s) ahead",
        f"Terminate never, raise this job's priority above never's (5), or {RAISE_A}"),
    "behind a head the nodes cannot hold": (behind_head_without_nodes, "BEHIND_BLOCKED_HEAD",
        "Quota share A is blocked by job wide (head of the share, which cannot start until the pool's nodes "
        "offer enough slots: it needs 2 ml.g5.xlarge but the online nodes of pool default offer 1); "
        "1 job(s) ahead",
        "Terminate wide, raise this job's priority above wide's (5), or bring nodes online (or undrain them) "
        "so that pool default offers at least 2 ml.g5.xlarge slots"),
    "never runnable behind the head": (blocked_behind_the_head, SE_MAX,
        f"{SE_MAX} - Job needs 4 ml.g5.xlarge but service environment se allows at most 3",
        "Terminate it, resubmit it needing at most 3, or raise service environment se's maxCapacity for "
        "ml.g5.xlarge to at least 4"),
    "preemptions in progress": (waiting_for_preemption, "WAITING_FOR_PREEMPTION",
        "Waiting for 1 preempted job(s) to stop: a2",
        "Wait: preempted jobs stop within their nodes' grace period"),
    "environment disabled": (environment_disabled, "SERVICE_ENVIRONMENT_DISABLED",
        "Service environment se of job queue jq is DISABLED", "Enable service environment se"),
    "more than a LEND share may hold": (head_over_a_lend_share, QUOTA,
        "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - Job needs 2 ml.g5.xlarge but quota share A may "
        "hold at most 1",
        f"Terminate it, resubmit it needing at most 1, or {RAISE_A}"),
    "more than a borrowing share may hold": (head_over_a_borrowing_share,
        "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
        "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - Job needs 3 ml.g5.xlarge but quota share A may "
        "hold at most 2",
        "Terminate it, resubmit it needing at most 2, or raise quota share A's limit or borrowLimit so that "
        "it may hold 3 ml.g5.xlarge"),
    "more than the environment allows": (head_over_the_environment, SE_MAX,
        f"{SE_MAX} - Job needs 4 ml.g5.xlarge but service environment se allows at most 3",
        "Terminate it, resubmit it needing at most 3, or raise service environment se's maxCapacity for "
        "ml.g5.xlarge to at least 4"),
    "more than the nodes offer": (head_without_nodes, "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
        "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Job needs 3 ml.g5.xlarge but the online nodes of pool "
        "default offer 2",
        "Terminate it, resubmit it needing at most 2, or bring nodes online (or undrain them) so that pool "
        "default offers at least 3 ml.g5.xlarge slots"),
    "the pool held by other environments": (no_capacity_for_unit, "NO_CAPACITY_FOR_UNIT",
        "All 2 ml.g5.xlarge slots of pool default are held by jobs of other service environments",
        "Wait for them to finish, or give job queue jq a higher priority than their queues' (environments "
        "sharing a pool are served in that order)"),
    "within quota, pool full": (pool_full, "WAITING_FOR_OWN_QUOTA",
        "Within quota share B's limit (0 in use + 1 needed <= 2), but only 0 of the 2 ml.g5.xlarge are free "
        "for it (2 in use, 0 reserved by other RESERVE shares) and not enough borrowed capacity can be "
        "reclaimed", WAIT),
    "a RESERVE share's job over its limit": (reserve_share_over_its_limit, "WAITING_FOR_OWN_QUOTA",
        "Quota share R (RESERVE) may not borrow, and the job does not fit its limit: 2 in use + 2 needed > 3",
        "Wait until the share's jobs use at most 1 ml.g5.xlarge, or raise its limit"),
    "borrow limit": (borrow_limit_reached, "BORROW_LIMIT_REACHED",
        "Quota share A may hold at most 2 ml.g5.xlarge (limit 1, borrowLimit 100%): 2 in use + 1 needed > 2",
        "Wait until the share's jobs use at most 1 ml.g5.xlarge, or raise its borrowLimit"),
    "idle but reserved": (idle_capacity_reserved, "IDLE_CAPACITY_RESERVED",
        "1 of the 2 ml.g5.xlarge are idle, but RESERVE shares reserve 1 for their own jobs; borrowing 1 "
        "would take reserved capacity", "Wait: reserved capacity is never lent"),
    "too little idle": (too_little_idle, "NO_IDLE_CAPACITY",
        "Not enough idle capacity to borrow: 1 of the 4 ml.g5.xlarge idle, it needs 2", WAIT),
    "minimum runtime": (min_runtime, "WAITING_FOR_MIN_RUNTIME",
        f"The capacity it could reclaim is protected by {MIN_RUNTIME_TAG} until 1060007",
        "Wait for the protected jobs' minimum runtime to end"),
    "reborrow backoff": (reborrow_backoff, "REBORROW_BACKOFF",
        "Quota share A may not borrow again until 1030013", "Wait for the share's reborrow backoff to end"),
    "ready": (ready, "READY", "The job fits and will be dispatched by the next scheduling pass", ""),
    "dispatched": (dispatched, "DISPATCHED", "Attempt a#1 holds 1 ml.g5.xlarge", ""),
    "stopping": (stopping, "STOPPING", "not needed", ""),
}
# fmt: on


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_each_message_says_what_the_state_is_and_what_helps(kind: tuple[Scenario, str, str, str]) -> None:
    scenario, reason, message, action = kind
    h, job_id = scenario()
    found = explain(h.state, job_id, now=h.now)
    assert found is not None
    assert (found.reason, found.message, found.action) == (reason, message, action)
    if found.figures:  # the printed figures are the state's
        record = h.state.jobs[job_id]
        queued = h.state.shares[record.share]
        assert found.figures["demand"] == record.count
        assert found.figures["share_limit"] == queued.limits.get(record.unit, 0)
        assert found.position == queued.queue.index(record.queue_key)


def shown(h: Harness) -> dict[str, str | None]:
    """Each queued job's ``statusReason`` as the read model, folded from the log, shows it."""
    rm = ReadModel()
    for event in h.events:
        rm.apply(event)
    return {j.spec.job_id: j.blocked_reason for j in rm.jobs.values() if j.status.value == "RUNNABLE"}


SE_TAIL = "service environment se allows at most 3"
SE_4 = f"{SE_MAX} - Job needs 4 ml.g5.xlarge but {SE_TAIL}"
NO_NODES = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"


def test_a_job_that_can_never_run_carries_its_reason_wherever_it_waits() -> None:
    h, _ = blocked_behind_the_head()
    assert shown(h) == {"head": None, "big": SE_4}
    assert h.blocked("big") is None  # not the head: no time limit counts for it (S9.2)
    # The head leaves: big is the blocked head now, its S9.2 clock starting at this moment.
    h.terminate("head")
    assert h.blocked("big") == SE_MAX and h.state.shares[("jq", "A")].blocked_behind == {}
    assert h.state.shares[("jq", "A")].blocked == ("big", SE_MAX, SE_4, h.now)
    # A more urgent job goes first: big keeps its reason behind it.
    h.submit(job("urgent").share("A").priority(9))
    assert shown(h) == {"urgent": None, "big": SE_4} and h.blocked("big") is None
    # The environment's limit is raised: no longer blocked, wherever it is.
    # The environment's limit is raised: the next bound is the nodes'; a node joins: not blocked.
    h.environment_limits("se", {G5: 4})
    assert shown(h) == {
        "urgent": None,
        "big": SE_4.replace(SE_MAX, NO_NODES).replace(SE_TAIL, "the online nodes of pool default offer 3"),
    }
    h.node("node-1", ml_g5_xlarge=1)  # urgent runs on it; big waits its turn, no longer blocked
    assert shown(h) == {"big": None}
    assert fingerprint(replay(h.events, h.state.heartbeat_timeout_ms)) == fingerprint(h.state)


def test_nodes_coming_and_going_block_and_unblock_jobs_behind_the_head() -> None:
    h = basic(3, 3, share("A").limit(3))
    h.submit(job("run").share("A").needs(3), job("next").share("A"), job("wide").share("A").needs(3))
    assert shown(h) == {"next": None, "wide": None}
    # A node is lost: run is requeued at the head, and neither it nor wide behind it can run on two.
    h.deregister("node-2")
    reason = f"{NO_NODES} - Job needs 3 ml.g5.xlarge but the online nodes of pool default offer 2"
    assert shown(h) == {"run": reason, "next": None, "wide": reason}
    assert h.blocked("run") == NO_NODES and h.blocked("wide") is None
    h.node("node-3", ml_g5_xlarge=1)
    assert shown(h) == {"next": None, "wide": None} and h.status("run") == "SCHEDULED"
    h.deregister("node-3").terminate("wide")  # a blocked job that leaves takes its record with it
    assert h.state.shares[("jq", "A")].blocked_behind == {}
    assert fingerprint(replay(h.events, h.state.heartbeat_timeout_ms)) == fingerprint(h.state)


def test_a_job_that_only_waits_gets_no_status_reason() -> None:
    h, _ = behind_blocked_head()
    never = f"{QUOTA} - Job needs 2 ml.g5.xlarge but quota share A may hold at most 1"
    assert shown(h) == {"never": never, "fits": None}


def test_submitting_a_job_that_fits_behind_the_head_skips_the_pass() -> None:
    """The pass runs for a queued job only if it can never run (to record it): the cost per input stays
    independent of the queue's length."""
    h = basic(1, 1, share("A").limit(1)).submit(job("a1").share("A"), job("a2").share("A"))
    assert [e.type for e in h.submit(job("a3").share("A")).last] == ["JobAccepted"]
    assert [e.type for e in h.submit(job("a4").share("A").needs(2)).last] == ["JobAccepted", "JobBlocked"]
