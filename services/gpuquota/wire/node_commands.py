"""Commands from the scheduler to node agents (topic ``gpuquota.node-commands``, key = node id).

The scheduler shell derives them from decided events: ``JobDispatched`` becomes one ``RunAttempt``
per node of the placement; ``JobPreempted``, ``JobStopRequested`` and ``AttemptFenced`` become
``StopAttempt``; an ``InputRejected`` of a node's heartbeat (the node is unknown or was declared lost
while its agent kept running) becomes ``RegisterAgain``. ``event_id`` derives from the event's id, so
consumers can de-duplicate.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from gpuquota.wire.base import Frozen, Message


class GangNode(Frozen):
    """One node of an attempt's placement: its instances are ranks ``first_rank`` ...
    ``first_rank + instances - 1`` (hosts ``algo-<rank + 1>``), reached at ``address``."""

    node_id: str
    instances: Annotated[int, Field(ge=1)]
    first_rank: Annotated[int, Field(ge=0)]
    address: str = ""


class RunAttempt(Message):
    type: Literal["RunAttempt"] = "RunAttempt"
    node_id: str
    job_id: str
    job_name: str
    attempt_id: str
    attempt_number: int
    unit: str
    slots: tuple[int, ...]
    gpus: tuple[int, ...] = ()
    payload: str = ""
    """The job's ``serviceRequestPayload``: a SageMaker CreateTrainingJob request as JSON."""
    gang: tuple[GangNode, ...] = ()
    """Every node of the attempt in rank order, this one included, so that all agree on the hosts, the
    ranks and ``MASTER_ADDR`` (the first node's address); empty: the attempt runs on this node only."""
    incarnation: str = ""
    """The ``RegisterNode.incarnation`` of the node's registration the attempt was dispatched to. An
    agent that registered since (a restart, a registration again) drops the command: that registration
    did not list the attempt, so the scheduler requeued it. Empty: dispatched before incarnations."""


class StopAttempt(Message):
    type: Literal["StopAttempt"] = "StopAttempt"
    node_id: str
    job_id: str
    attempt_id: str
    reason: str
    grace_seconds: Annotated[float, Field(ge=0, le=86400)] | None = None
    """Seconds between SIGTERM and SIGKILL; ``None``: the node agent's ``GPUQUOTA_PREEMPTION_GRACE``."""


class RegisterAgain(Message):
    """The scheduler does not count the node as registered (lost after missed heartbeats, or unknown):
    the agent sends its ``RegisterNode`` again and re-reports the attempts it still runs (the
    scheduler fences those it no longer assigns to the node)."""

    type: Literal["RegisterAgain"] = "RegisterAgain"
    node_id: str
    reason: str


NodeCommand = Annotated[RunAttempt | StopAttempt | RegisterAgain, Field(discriminator="type")]
NODE_COMMAND_ADAPTER: TypeAdapter[NodeCommand] = TypeAdapter(NodeCommand)
