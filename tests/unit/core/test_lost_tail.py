"""A log shorter than what the scheduler acted on (``core.lost_tail``, issue #30): a node's SUCCEEDED for
an attempt the log lost is adopted, so the job is never run again; nothing else changes."""

from __future__ import annotations

from gpuquota.core import fingerprint, replay
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobStatus
from tests.builders import Harness, job, share


def cluster(capacity: int, nodes: int = 1) -> Harness:
    return Harness.basic(capacity=capacity, nodes=nodes).with_shares(share("QS1").limit(capacity).lend())


def free_slots(h: Harness) -> dict[str, int]:
    return {n.node_id: sum(len(f) for f in n.free.values()) for n in h.state.nodes.values()}


def test_a_success_for_an_attempt_the_log_never_dispatched_is_adopted() -> None:
    # one slot: a runs, b waits; the log lost b's dispatch and everything after it, b's node did not
    h = cluster(1).submit(job("a"), job("b"))
    assert h.record("b").status is JobStatus.RUNNABLE and h.record("b").attempt_number == 0
    h.report_attempt("node-0", "b", "b#1", "SUCCEEDED")

    (adopted,) = h.last
    assert isinstance(adopted, ev.JobSucceeded) and adopted.attempt_id == "b#1"
    assert "b" not in h.state.jobs  # terminal: never dispatched again
    assert h.record("a").status is JobStatus.SCHEDULED  # the other job is untouched
    assert fingerprint(replay(h.events)) == fingerprint(h.state)  # replayable


def test_a_success_reported_from_another_node_than_the_log_placed_it_is_adopted_and_fenced() -> None:
    # the shorter log dispatched a#1 again, to node-0; node-1 had run a#1 to success before the loss
    h = cluster(2, nodes=2).submit(job("a"))
    placed = {p.node_id for p in h.record("a").placements}
    other = ({"node-0", "node-1"} - placed).pop()
    h.report_attempt(other, "a", "a#1", "SUCCEEDED")

    fenced = [e for e in h.last if isinstance(e, ev.AttemptFenced)]
    assert [(e.node_id, e.attempt_id) for e in fenced] == [(placed.pop(), "a#1")]  # stopped now
    assert isinstance(h.last[-1], ev.JobSucceeded) and "a" not in h.state.jobs
    assert free_slots(h) == {"node-0": 1, "node-1": 1}  # nothing held


def test_a_success_listed_by_a_heartbeat_is_adopted_as_well() -> None:
    h = cluster(1).submit(job("a"), job("b"))
    listed = (inp.NodeAttempt(job_id="b", attempt_id="b#1", status="SUCCEEDED", exit_code=0),)
    h.feed(inp.NodeHeartbeat, node_id="node-0", attempts=listed)
    assert any(isinstance(e, ev.JobSucceeded) and e.job_id == "b" for e in h.last)
    assert "b" not in h.state.jobs


def test_late_reports_and_failures_are_not_adopted() -> None:
    h = cluster(2, nodes=2).submit(job("a"))
    (first,) = {p.node_id for p in h.record("a").placements}
    h.running("a").elapse(40_000, silent=[first])  # its node is lost: a#1 requeued, a#2 elsewhere
    assert h.record("a").attempt_id == "a#2"
    # a report of the attempt requeued with its lost node: late, ignored (S5.7)
    h.report_attempt(first, "a", "a#1", "SUCCEEDED")
    assert not any(isinstance(e, ev.JobSucceeded) for e in h.last)
    # a FAILED of an attempt the log does not know: the job runs again, as a retry would
    h.report_attempt(first, "a", "a#3", "FAILED", exit_code=1)
    assert not any(isinstance(e, ev.JobSucceeded | ev.JobFailed) for e in h.last)
    # an id the core did not make
    h.report_attempt(first, "a", "something-else", "SUCCEEDED")
    assert h.record("a").attempt_id == "a#2"
