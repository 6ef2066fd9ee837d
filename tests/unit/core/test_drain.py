"""Draining a node (``gpuquota nodes drain`` / ``undrain``): no new dispatches on it, its running
attempts finish, ``UndrainNode`` puts it back; a drain outlives the agent's re-registration; replay."""

from __future__ import annotations

from gpuquota.core import fingerprint, replay
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from tests.builders import Harness, job, share


def two_nodes(per_node: int = 1) -> Harness:
    capacity = 2 * per_node
    return Harness.basic(capacity=capacity, nodes=2).with_shares(share("QS1").limit(capacity))


def test_a_drained_node_gets_no_new_attempts_and_its_running_attempt_finishes() -> None:
    h = two_nodes(per_node=2)
    h.submit(job("a1")).running("a1")
    ((node, _, _),) = h.placement("a1")
    other = "node-1" if node == "node-0" else "node-0"
    (draining,) = h.feed(inp.DrainNode, node_id=node)
    assert isinstance(draining, ev.NodeDraining) and h.state.nodes[node].draining
    assert h.feed(inp.DrainNode, node_id=node) == []  # idempotent
    assert h.status("a1") == "RUNNING"  # not stopped

    # S2.1: C(u) counts only the other node's 2 slots, and a1 still holds one of C
    h.submit(job("a2"), job("a3"))
    assert h.placement("a2")[0][0] == other and h.status("a3") == "RUNNABLE"
    h.succeed("a1")
    assert h.placement("a3")[0][0] == other  # the drained node's free slots are not offered
    h.submit(job("a4"))
    assert h.status("a4") == "RUNNABLE"

    # the agent restarts and registers again (same slots, still online): still drained
    h.node(node, ml_g5_xlarge=2)
    assert h.state.nodes[node].draining and h.status("a4") == "RUNNABLE"

    (undrained, *dispatched) = h.feed(inp.UndrainNode, node_id=node)
    assert isinstance(undrained, ev.NodeUndrained)
    assert [d.job_id for d in dispatched if isinstance(d, ev.JobDispatched)] == ["a4"]
    assert h.placement("a4")[0][0] == node and not h.state.nodes[node].draining
    assert h.feed(inp.UndrainNode, node_id=node) == []  # idempotent

    assert fingerprint(replay(h.events)) == fingerprint(h.state)


def test_undrain_of_an_unknown_node_is_rejected() -> None:
    h = two_nodes()
    (rejected,) = h.feed(inp.UndrainNode, node_id="stranger")
    assert isinstance(rejected, ev.InputRejected) and rejected.reason == "Node stranger is not registered"


def test_a_lost_node_that_registers_again_is_not_drained() -> None:
    h = two_nodes()
    h.feed(inp.DrainNode, node_id="node-0")
    h.elapse(38_000, silent=["node-0"])
    assert not h.state.nodes["node-0"].online
    h.node("node-0", ml_g5_xlarge=1)
    assert not h.state.nodes["node-0"].draining
    h.submit(job("b1"), job("b2"))
    assert {h.placement(j)[0][0] for j in ("b1", "b2")} == {"node-0", "node-1"}
    assert fingerprint(replay(h.events)) == fingerprint(h.state)
