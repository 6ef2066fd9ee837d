"""The Kafka topic catalogue, as data: names, keys, partitions, retention and the messages they carry.

Every record value is one message of the wire contract, as JSON (``model_dump_json``); the record key
is the UTF-8 string named by ``key``. ``python -m gpuquota.wire.export`` writes this catalogue to
``schemas/topics.json`` next to the JSON Schemas of the messages.

Node reports have no topic of their own. ``RegisterNode``, ``NodeHeartbeat``, ``AttemptReport``,
``DrainNode`` and ``DeregisterNode`` are scheduler inputs, and a pool's scheduler must decide them in
one order together with the pool's commands and ticks (a report and a command about the same job
race otherwise). So node agents produce them straight to ``gpuquota.scheduler.inputs``, keyed by
their pool (``GPUQUOTA_POOL``), like every other input: one partition holds one pool's whole input
stream, and the scheduler's consumer positions cover a single topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from gpuquota.wire.base import Message
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.events import JOB_STATE_EVENTS
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand

DAY_MS = 24 * 60 * 60 * 1000
DEFAULT_PARTITIONS = 8


def union_members(union: Any) -> tuple[type[Message], ...]:
    """The model classes of a discriminated union ``Annotated[A | B | ..., Field(...)]``."""
    members: tuple[type[Message], ...] = get_args(get_args(union)[0])
    return members


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    key: str
    """What the record key holds; records with one key stay in order (one partition)."""
    schema: str
    """The file under ``schemas/`` that every value of the topic validates against."""
    messages: tuple[type[Message], ...]
    description: str
    partitions: int = DEFAULT_PARTITIONS
    cleanup_policy: Literal["delete", "compact"] = "delete"
    retention_ms: int = 7 * DAY_MS
    """How long Kafka keeps records (``-1``: forever)."""

    def config(self) -> dict[str, str]:
        """The topic-level Kafka configuration to create it with."""
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}


SCHEDULER_INPUTS = Topic(
    name="gpuquota.scheduler.inputs",
    key="pool",
    schema="scheduler-input.json",
    messages=union_members(SchedulerInput),
    description=(
        "Every scheduler input: commands from the gateway, node reports from node agents, ticks from "
        "the scheduler's timer. Keyed (co-partitioned) by pool, so one scheduler worker owns a pool's "
        "whole ordered stream; the event store records the consumed position with each decision."
    ),
)

JOB_STATE = Topic(
    name="gpuquota.job-state",
    key="job id",
    schema="scheduler-event.json",
    messages=JOB_STATE_EVENTS,
    description=(
        "The job events of the scheduler's log, each carrying the job's new status, for read models "
        "and notifications. Keyed by job id: a job's transitions arrive in order."
    ),
)

NODE_COMMANDS = Topic(
    name="gpuquota.node-commands",
    key="node id",
    schema="node-command.json",
    messages=union_members(NodeCommand),
    description=(
        "What node agents must do: RunAttempt and StopAttempt, derived from the scheduler's events. "
        "Keyed by node id, so each node's commands arrive in order. Old commands are useless: a "
        "restarted agent reports the attempts it still runs, and the scheduler fences the stale ones."
    ),
    retention_ms=1 * DAY_MS,
)

INPUT_RESULTS = Topic(
    name="gpuquota.input-results",
    key="pool",
    schema="InputResult.v1.json",
    messages=(InputResult,),
    description=(
        "One InputResult per input of gpuquota.scheduler.inputs (ACCEPTED or REJECTED with the reason), "
        "correlated by input_event_id; heartbeats only when rejected, ticks never. Keyed by the input's "
        "pool: a pool's results arrive in the order of its inputs."
    ),
)

DEAD_LETTER = Topic(
    name="gpuquota.dead-letter",
    key="original key",
    schema="DeadLetter.v1.json",
    messages=(DeadLetter,),
    description=(
        "Records a consumer could not decode or validate, with the reason and their original topic, "
        "partition and offset. Keyed by the original record's key. For people, not for replay loops."
    ),
    partitions=1,
    retention_ms=30 * DAY_MS,
)

TOPICS: tuple[Topic, ...] = (SCHEDULER_INPUTS, JOB_STATE, INPUT_RESULTS, NODE_COMMANDS, DEAD_LETTER)
TOPICS_BY_NAME: dict[str, Topic] = {topic.name: topic for topic in TOPICS}
