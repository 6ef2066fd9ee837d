"""The GPU node agent: runs the attempts the scheduler places on one node and reports on them (I3)."""

from gpuquota.node_agent.agent import NodeAgent
from gpuquota.node_agent.launch import AttemptHandle, LaunchError, LaunchSpec, Outcome, Runtime
from gpuquota.node_agent.payload import BadPayload, TrainingRequest, parse_payload
from gpuquota.node_agent.runtime import ProcessRuntime, SimulatedRuntime
from gpuquota.node_agent.sending import Send
from gpuquota.node_agent.slots import INSTANCE_TYPE_GPUS, SlotSpecError, discover_slots, parse_slots

__all__ = [
    "INSTANCE_TYPE_GPUS",
    "RUNTIMES",
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


RUNTIMES = ("process", "simulated", "container")


def make_runtime(kind: str, container_engine: str | None = None, image_map: str = "") -> Runtime:
    """``process`` (alias ``subprocess``), ``simulated`` (alias ``fake``) or ``container`` (with
    ``container_engine`` podman or docker; default: the first found; ``image_map`` the text of
    ``GPUQUOTA_IMAGE_MAP``). Raises ValueError."""
    if kind in ("process", "subprocess"):
        return ProcessRuntime()
    if kind in ("simulated", "fake"):
        return SimulatedRuntime()
    if kind == "container":
        from gpuquota.config.image_map import ImageMap
        from gpuquota.node_agent.container import ContainerEngine, ContainerRuntime, EngineMissing

        try:
            return ContainerRuntime(ContainerEngine.find(container_engine), ImageMap.parse(image_map))
        except EngineMissing as exc:
            raise ValueError(str(exc)) from None
    raise ValueError(f"unknown runtime {kind!r}: expected process, simulated or container")
