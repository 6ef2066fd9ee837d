"""``gpuquota.sim.impact``: what a configuration change would do, on cases worked by hand.

Every running job here is assumed to end an hour after its dispatch (``HOUR``), so each start that
moves moves by a figure the test can name; ``impact`` leaves the state exactly as it found it.
"""

from __future__ import annotations

from typing import Any

from gpuquota.core import fingerprint
from gpuquota.core.state import JobRecord
from gpuquota.sim.impact import impact
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import CapacityLimit, ServiceEnvironmentSpec
from tests.builders import G5, Harness, ShareBuilder, job, share

HOUR = 3_600_000
MINUTE = 60_000


def an_hour_each(job: JobRecord, now: int) -> int:
    assert job.scheduled_at is not None
    return max(now, job.scheduled_at + HOUR)


def update(h: Harness, builder: ShareBuilder) -> inp.UpdateQuotaShare:
    return inp.UpdateQuotaShare(event_id="dry-1", occurred_at=h.now + 1, spec=builder.build())


def impact_of(h: Harness, *inputs: inp.SchedulerInput) -> dict[str, Any]:
    before = fingerprint(h.state)
    found = impact(h.state, list(inputs), h.now + 1, an_hour_each).as_json()
    assert fingerprint(h.state) == before, "impact changed the state"
    return found


def jobs(rows: list[dict[str, Any]]) -> list[str]:
    return [row["job"] for row in rows]


def figures(found: dict[str, Any], name: str, side: str) -> dict[str, Any]:
    row = next(r for r in found["shares"] if r["quotaShareName"] == name)
    return {k: v for k, v in row[side].items() if k != "strategy"} | {"strategy": row[side]["strategy"]}


def lower_a_limit() -> Harness:
    """SE of 3; A (LEND_AND_BORROW, 2) runs a_low (priority 1) then a_high (priority 5) ten minutes
    later; B (LEND, 2) runs b1 and b2 waits in its quota: nobody borrows, so nothing is reclaimed."""
    h = Harness.basic(3, 1).with_shares(share("A").limit(2).lend_and_borrow(), share("B").limit(2))
    h.submit(job("a_low").share("A").priority(1)).running("a_low").advance(10 * MINUTE)
    h.submit(job("a_high").share("A").priority(5)).running("a_high")
    h.submit(job("b1").share("B")).running("b1").submit(job("b2").share("B"))
    assert h.status("b2") == "RUNNABLE"
    return h


def test_lowering_a_limit_preempts_the_borrower_aws_rules_pick() -> None:
    h = lower_a_limit()
    b2_was = next(iter(impact_of(h)["start_changes"]), None)
    assert b2_was is None  # no change, nothing moves

    found = impact_of(h, update(h, share("A").limit(1).lend_and_borrow()))

    # A now borrows 1: B's in-quota head reclaims it at once, lowest priority first (S4.1), even
    # though a_high was dispatched more recently.
    assert jobs(found["preempted_now"]) == ["a_low"]
    assert found["preempted_now"][0]["kind"] == "CROSS_SHARE"
    assert "capacity reclaimed by quota share B" in found["preempted_now"][0]["reason"]
    # requeued, a_low waits for A's own instance: a_high's end, an hour after its dispatch
    assert found["preempted_now"][0]["restartAt"] == h.state.jobs["a_high"].scheduled_at + HOUR  # type: ignore[operator]
    assert found["becomes_borrowing"] == []  # what A borrows is already being stopped
    (moved,) = found["start_changes"]
    a_low_ends = h.state.jobs["a_low"].scheduled_at + HOUR  # type: ignore[operator]
    assert (moved["job"], moved["before"], moved["after"]) == ("b2", a_low_ends, h.now + 1)
    assert moved["movedSeconds"] == round((h.now + 1 - a_low_ends) / 1000, 1)
    assert figures(found, "A", "before")["borrowed"] == {G5: 0}
    assert figures(found, "A", "after")["borrowed"] == {G5: 1}
    assert figures(found, "A", "after")["limits"] == {G5: 1}
    assert found["rejected"] == [] and found["complete"]


def test_lowering_a_limit_without_a_claimant_makes_its_jobs_borrowers() -> None:
    """S4.5: nothing is preempted, but the jobs above the new limit become reclaimable, the job a
    reclaim would take first (lowest priority) first."""
    h = Harness.basic(3, 1).with_shares(share("A").limit(3).lend_and_borrow(), share("B").limit(1))
    h.submit(job("a_low").share("A").priority(1), job("a_mid").share("A").priority(3))
    h.submit(job("a_high").share("A").priority(5)).running("a_low", "a_mid", "a_high")

    found = impact_of(h, update(h, share("A").limit(1).lend_and_borrow()))

    assert found["preempted_now"] == []
    assert jobs(found["becomes_borrowing"]) == ["a_low", "a_mid"]
    assert figures(found, "A", "after")["borrowed"] == {G5: 2}
    assert figures(found, "B", "after")["lent"] == {G5: 1}


def test_lend_to_reserve_takes_back_the_lent_capacity() -> None:
    """S8's shares: QS1 runs q1 and, ten minutes later, q2 on QS2's lent instance; q3 waits. With
    QS2 RESERVE its instance is no longer lent: q3 cannot borrow when q1 ends, and waits for q2."""
    h = Harness.worked_example()
    h.submit(job("q1").share("QS1")).running("q1").advance(10 * MINUTE)
    h.submit(job("q2").share("QS1")).running("q2").submit(job("q3").share("QS1"))
    q1, q2 = (h.state.jobs[j].scheduled_at for j in ("q1", "q2"))
    assert q1 is not None and q2 is not None

    found = impact_of(h, update(h, share("QS2").limit(1).reserve()))

    assert figures(found, "QS2", "before") == {
        "strategy": "LEND",
        "limits": {G5: 1},
        "usage": {G5: 0},
        "borrowed": {G5: 0},
        "lent": {G5: 1},
        "reserved": {G5: 0},
    }
    assert figures(found, "QS2", "after")["strategy"] == "RESERVE"
    assert (figures(found, "QS2", "after")["lent"], figures(found, "QS2", "after")["reserved"]) == (
        {G5: 0},
        {G5: 1},
    )
    assert figures(found, "QS1", "after")["borrowed"] == {G5: 1}  # q2 keeps running, reclaimable
    assert found["preempted_now"] == [] and found["becomes_borrowing"] == []
    (moved,) = found["start_changes"]
    assert (moved["job"], moved["before"], moved["after"]) == ("q3", q1 + HOUR, q2 + HOUR)
    assert moved["movedSeconds"] == 600.0


def test_raising_a_limit_starts_a_queued_job_at_once() -> None:
    h = Harness.basic(3, 1).with_shares(share("A").limit(1), share("B").limit(1))
    h.submit(job("a1").share("A")).running("a1").submit(job("a2").share("A"))
    found = impact_of(h, update(h, share("A").limit(2)))
    (moved,) = found["start_changes"]
    assert (moved["job"], moved["after"]) == ("a2", h.now + 1)
    assert figures(found, "A", "after")["usage"] == {G5: 2}


def test_an_input_the_core_refuses_is_reported() -> None:
    h = Harness.basic(3, 1).with_shares(share("A").limit(1))
    spec = ServiceEnvironmentSpec(name="missing", capacity_limits=(CapacityLimit(unit=G5, max_capacity=1),))
    message = inp.UpdateServiceEnvironment(event_id="dry-1", occurred_at=h.now + 1, spec=spec)
    found = impact_of(h, message)
    assert [r["input"] for r in found["rejected"]] == ["UpdateServiceEnvironment"]
