"""``gpuquota.scheduler.commands.node_commands``: the node commands derived from decided events."""

from __future__ import annotations

from gpuquota.core import ClusterState
from gpuquota.scheduler.commands import node_commands
from gpuquota.wire import events as ev
from gpuquota.wire.node_commands import NODE_COMMAND_ADAPTER, RegisterAgain


def rejected(input_type: str, node_id: str | None, **fields: object) -> ev.InputRejected:
    return ev.InputRejected(
        event_id="in-7/0",
        occurred_at=1234,
        input_event_id="in-7",
        input_type=input_type,
        reason=f"Node {node_id} is not registered; register it again",
        node_id=node_id,
        **fields,
    )


def test_a_rejected_heartbeat_asks_its_node_to_register_again() -> None:
    (command,) = node_commands(ClusterState(), rejected("NodeHeartbeat", "n1"))
    reason = "Node n1 is not registered; register it again"
    assert command == RegisterAgain(event_id="in-7/0", occurred_at=1234, node_id="n1", reason=reason)
    # on the wire like every node command
    assert NODE_COMMAND_ADAPTER.validate_json(command.model_dump_json()) == command
    assert command.schema_version == 1


def test_the_command_id_derives_from_the_event_id() -> None:
    first = node_commands(ClusterState(), rejected("NodeHeartbeat", "n1"))
    again = node_commands(ClusterState(), rejected("NodeHeartbeat", "n1"))
    assert [c.event_id for c in first] == [c.event_id for c in again] == ["in-7/0"]


def test_other_rejections_command_nothing() -> None:
    state = ClusterState()
    assert node_commands(state, rejected("NodeHeartbeat", None)) == []  # no node named
    assert node_commands(state, rejected("DrainNode", "n1")) == []  # only heartbeats
    assert node_commands(state, rejected("AttemptReport", "n1", job_id="j")) == []
    assert node_commands(state, rejected("SubmitJob", None, job_id="j")) == []
