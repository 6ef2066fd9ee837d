"""The GPU node agent: runs the attempts the scheduler places on one node and reports on them (I3)."""

from gpuquota.node_agent.agent import LOST_REASON, NodeAgent, Send
from gpuquota.node_agent.payload import BadPayload, TrainingRequest, parse_payload
from gpuquota.node_agent.runtime import (
    AttemptHandle,
    LaunchError,
    LaunchSpec,
    Outcome,
    ProcessRuntime,
    Runtime,
    SimulatedRuntime,
)
from gpuquota.node_agent.slots import INSTANCE_TYPE_GPUS, SlotSpecError, discover_slots, parse_slots

__all__ = [
    "INSTANCE_TYPE_GPUS",
    "LOST_REASON",
    "AttemptHandle",
    "BadPayload",
    "LaunchError",
    "LaunchSpec",
    "NodeAgent",
    "Outcome",
    "ProcessRuntime",
    "Runtime",
    "Send",
    "SimulatedRuntime",
    "SlotSpecError",
    "TrainingRequest",
    "discover_slots",
    "make_runtime",
    "parse_payload",
    "parse_slots",
]


def make_runtime(kind: str) -> Runtime:
    """``process`` (alias ``subprocess``) or ``simulated`` (alias ``fake``)."""
    if kind in ("process", "subprocess"):
        return ProcessRuntime()
    if kind in ("simulated", "fake"):
        return SimulatedRuntime()
    raise ValueError(f"unknown runtime {kind!r}: expected process or simulated")
