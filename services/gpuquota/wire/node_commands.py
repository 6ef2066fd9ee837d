"""Commands from the scheduler to node agents (topic ``gpuquota.node-commands``, key = node id).

The scheduler shell derives them from decided events: ``JobDispatched`` becomes one ``RunAttempt``
per node of the placement; ``JobPreempted``, ``JobStopRequested`` and ``AttemptFenced`` become
``StopAttempt``. ``event_id`` derives from the event's id, so consumers can de-duplicate.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from gpuquota.wire.base import Message


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


class StopAttempt(Message):
    type: Literal["StopAttempt"] = "StopAttempt"
    node_id: str
    job_id: str
    attempt_id: str
    reason: str
    grace_seconds: Annotated[float, Field(ge=0, le=86400)] | None = None
    """Seconds between SIGTERM and SIGKILL; ``None``: the node agent's ``GPUQUOTA_PREEMPTION_GRACE``."""


NodeCommand = Annotated[RunAttempt | StopAttempt, Field(discriminator="type")]
NODE_COMMAND_ADAPTER: TypeAdapter[NodeCommand] = TypeAdapter(NodeCommand)
