"""An attempt spread over several nodes (I6): it ends once, when its last part has ended; a failed
part stops the others and the attempt fails with that part's reason; node commands tell each node
the whole gang."""

from __future__ import annotations

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.core.state import ClusterState
from gpuquota.scheduler.commands import node_commands
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import InstanceOutput
from gpuquota.wire.node_commands import GangNode, NodeCommand, RunAttempt, StopAttempt
from tests.builders import G5, Harness, job, share

REASON = algorithm_error("Instance algo-2 (rank 1) failed: exited with code 7")


class Recording(Harness):
    """Keeps the node commands a shell would send for each event."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[NodeCommand] = []

    def before_event(self, event: ev.SchedulerEvent) -> None:
        self.commands.extend(node_commands(self.state, event))


def two_single_slot_nodes(retries: int = 1) -> Recording:
    h = Recording()
    h.policy().environment_limits("se", {G5: 2}).queue()
    for node_id, address in (("node-a", "10.0.0.1"), ("node-b", "")):
        slots = (SlotOffer(unit=G5, gpus=(0,)),)
        h.feed(inp.RegisterNode, node_id=node_id, slots=slots, address=address)
    h.share(share("QS1").limit(2).reserve())
    h.submit(job("gang").needs(2).retries(retries))
    h.running("gang")
    return h


def report(h: Harness, node_id: str, status: str, **fields: object) -> None:
    attempt_id = h.record("gang").attempt_id
    h.feed(inp.AttemptReport, node_id=node_id, job_id="gang", attempt_id=attempt_id, status=status, **fields)


def test_each_node_gets_the_whole_gang_in_rank_order() -> None:
    h = two_single_slot_nodes()
    runs = [c for c in h.commands if isinstance(c, RunAttempt)]
    assert sorted(r.node_id for r in runs) == ["node-a", "node-b"]
    gang = (
        GangNode(node_id=runs[0].gang[0].node_id, instances=1, first_rank=0, address=runs[0].gang[0].address),
        GangNode(node_id=runs[0].gang[1].node_id, instances=1, first_rank=1, address=runs[0].gang[1].address),
    )
    assert all(r.gang == gang for r in runs)
    # a node that advertised no address is reached by its node id
    assert {(g.node_id, g.address) for g in gang} == {("node-a", "10.0.0.1"), ("node-b", "node-b")}


def test_a_failed_part_stops_the_others_and_fails_the_attempt_once_with_its_reason() -> None:
    h = two_single_slot_nodes()
    report(h, "node-b", "FAILED", exit_code=7, status_reason=REASON)
    assert h.status("gang") == "RUNNING" and h.stopping("gang")
    assert h.usage("QS1") == 2, "the capacity is held until every part is gone"
    stops = [c for c in h.commands if isinstance(c, StopAttempt)]
    assert [(s.node_id, s.reason) for s in stops] == [("node-a", REASON)]
    # the node's repeated report changes nothing
    assert [type(e) for e in h.feed(inp.NodeHeartbeat, node_id="node-b", attempts=())] == []
    report(h, "node-b", "FAILED", exit_code=7, status_reason=REASON)
    assert h.last == []
    report(h, "node-a", "STOPPED", status_reason=REASON)
    assert (h.status("gang"), h.reason("gang")) == ("FAILED", REASON)
    assert [e.type for e in h.events if e.type in ("JobFailed", "JobRequeued")] == ["JobFailed"]
    assert h.state.nodes["node-a"].free[G5] == [0] and h.state.nodes["node-b"].free[G5] == [0]


def test_a_failed_part_retries_the_whole_attempt() -> None:
    h = two_single_slot_nodes(retries=2)
    report(h, "node-a", "FAILED", exit_code=3)
    report(h, "node-b", "SUCCEEDED")  # it ended before the stop reached it: the attempt still failed
    assert h.status("gang") == "SCHEDULED" and h.record("gang").attempt_number == 2
    assert h.record("gang").parts_over == ()
    (requeued,) = [e for e in h.events if isinstance(e, ev.JobRequeued)]
    assert (requeued.cause, requeued.status_reason) == ("RETRY", algorithm_error("exited with code 3"))


def test_the_attempt_succeeds_when_every_part_has_succeeded() -> None:
    h = two_single_slot_nodes()
    report(h, "node-a", "SUCCEEDED")
    assert h.status("gang") == "RUNNING" and not h.stopping("gang")
    # the node forgot the attempt it reported: its heartbeat without it does not lose the attempt
    h.feed(inp.NodeHeartbeat, node_id="node-a", attempts=())
    assert h.status("gang") == "RUNNING"
    report(h, "node-b", "SUCCEEDED")
    assert h.status("gang") == "SUCCEEDED"


def test_a_preempted_gang_is_requeued_once_every_part_has_stopped() -> None:
    h = two_single_slot_nodes()
    h.terminate("gang", "stop it")
    stops = [c for c in h.commands if isinstance(c, StopAttempt)]
    assert sorted(s.node_id for s in stops) == ["node-a", "node-b"]
    report(h, "node-a", "STOPPED")
    assert h.status("gang") == "RUNNING"
    report(h, "node-b", "STOPPED")
    assert (h.status("gang"), h.reason("gang"), h.terminated("gang")) == ("FAILED", "stop it", True)


def test_a_lost_node_stops_the_parts_on_the_other_nodes() -> None:
    h = two_single_slot_nodes(retries=1)
    h.deregister("node-b")
    assert h.status("gang") == "RUNNABLE"
    stops = [c for c in h.commands if isinstance(c, StopAttempt)]
    assert "node-a" in {s.node_id for s in stops}


def test_final_reports_record_where_the_outputs_are() -> None:
    h = played_with_outputs()
    recorded = [e for e in h.events if isinstance(e, ev.AttemptOutputsRecorded)]
    assert [(e.node_id, [o.host for o in e.outputs]) for e in recorded] == [("node-b", ["algo-2"])]
    assert h.status("gang") == "FAILED"


def played_with_outputs() -> Harness:
    """A gang whose failing part reports its outputs (every event type of this module, for the contract
    test of ``tests/unit/core/test_contract.py``)."""
    h = two_single_slot_nodes()
    output = InstanceOutput(
        host="algo-2", model_dir="/w/attempts/a/algo-2/model", output_dir="/w/a/algo-2/output"
    )
    report(h, "node-b", "FAILED", exit_code=7, status_reason=REASON, outputs=(output,))
    report(h, "node-b", "FAILED", exit_code=7, status_reason=REASON, outputs=(output,))  # repeated: nothing
    report(h, "node-a", "STOPPED")
    return h


def test_replay_rebuilds_the_parts() -> None:
    h = two_single_slot_nodes()
    report(h, "node-b", "FAILED", exit_code=7, status_reason=REASON)
    from gpuquota.core import evolve, fingerprint

    replayed = ClusterState()
    for event in h.events:
        evolve(replayed, event)
    assert fingerprint(replayed) == fingerprint(h.state)
    assert replayed.jobs["gang"].parts_over == (("node-b", "FAILED"),)
    assert replayed.nodes["node-a"].address == "10.0.0.1"
