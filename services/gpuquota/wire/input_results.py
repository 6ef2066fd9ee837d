"""Input results: the one answer to each input a producer sends to ``gpuquota.scheduler.inputs``.

A training platform (or any producer) that sends ``SubmitJob``, ``UpdateJobPriority``, ``TerminateJob``
or a resource command learns its fate from one ``InputResult`` on ``gpuquota.input-results``, keyed
by the input's pool (so a pool's results arrive in the order of its inputs) and correlated by
``input_event_id``:

* ``ACCEPTED``: the scheduler recorded the input; ``events`` names what it decided (for a job, its
  events on ``gpuquota.job-state`` carry the same ``input_event_id`` as a record header);
* ``REJECTED``: the core refused it (``reason`` is the text the HTTP API gives as the message of its
  ``ClientException``), or the record could not be decoded (it is also dead-lettered; ``reason`` is the
  dead letter's).

The result's own ``event_id`` is ``result/<input_event_id>``: the same on every publication, so a
consumer drops a repeated one (the scheduler republishes the results of its last decisions after a
crash). Node heartbeats are answered only when rejected (the node must register again); ticks are the
scheduler's own and never answered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import EpochMs, Frozen, Message, Name
from gpuquota.wire.fast_construct import fast_construct

Verdict = Literal["ACCEPTED", "REJECTED"]
RESULT_PREFIX = "result/"


class DecidedEvent(Frozen):
    """One event the scheduler decided for the input."""

    type: str
    event_id: str


class InputResult(Message):
    type: Literal["InputResult"] = "InputResult"
    event_id: Annotated[str, Field(min_length=1, max_length=256 + len(RESULT_PREFIX))]
    """``result/<input_event_id>`` (so longer than other messages' ids may be)."""
    input_event_id: Annotated[str, Field(min_length=1, max_length=256)]
    input_type: str
    """The input's ``type`` (empty when the record had none)."""
    pool: Name
    """The input's pool (its record key), which is also this result's record key."""
    outcome: Verdict
    reason: Annotated[str, Field(max_length=4096)] | None = None
    """Why the input was rejected (``REJECTED`` only): the HTTP API's error message for the same input."""
    job_id: str | None = None
    """The job the input is about, if any."""
    events: tuple[DecidedEvent, ...] = ()
    """What the scheduler decided for an accepted input, in order."""


def _job_id(message: inp.SchedulerInput) -> str | None:
    if isinstance(message, inp.SubmitJob):
        return message.job.job_id
    job_id = getattr(message, "job_id", None)
    return job_id if isinstance(job_id, str) else None


def result_of(
    message: inp.SchedulerInput, events: Sequence[ev.SchedulerEvent], pool: str, occurred_at: EpochMs
) -> InputResult | None:
    """The answer to a decided input, or None for inputs nobody waits for (ticks, accepted heartbeats).

    Built without validation, as the core builds its events (it runs for every input): every field
    comes from a validated input or a decided event."""
    rejected = next(
        (e for e in events if isinstance(e, ev.InputRejected) and e.input_event_id == message.event_id), None
    )
    if isinstance(message, inp.Tick) or (rejected is None and isinstance(message, inp.NodeHeartbeat)):
        return None
    if rejected is not None:
        outcome: Verdict = "REJECTED"
        reason: str | None = rejected.reason[:4096]
        job_id = rejected.job_id or _job_id(message)
        decided: tuple[DecidedEvent, ...] = ()
    else:
        outcome, reason, job_id = "ACCEPTED", None, _job_id(message)
        decided = tuple(_decided_event(e.type, e.event_id) for e in events)
    return fast_construct(
        InputResult,
        {
            "event_id": RESULT_PREFIX + message.event_id,
            "occurred_at": occurred_at,
            "schema_version": 1,
            "type": "InputResult",
            "input_event_id": message.event_id,
            "input_type": message.type,
            "pool": pool,
            "outcome": outcome,
            "reason": reason,
            "job_id": job_id,
            "events": decided,
        },
    )


def _decided_event(kind: str, event_id: str) -> DecidedEvent:
    return fast_construct(DecidedEvent, {"type": kind, "event_id": event_id})


def result_of_undecodable(value: bytes, reason: str, pool: str, occurred_at: EpochMs) -> InputResult | None:
    """The answer to a record that is not a valid input, if it names an ``event_id`` to answer to."""
    try:
        document = json.loads(value)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    event_id, kind = document.get("event_id"), document.get("type")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 256:
        return None
    job = document.get("job")
    job_id = job.get("job_id") if isinstance(job, dict) else document.get("job_id")
    return InputResult(
        event_id=RESULT_PREFIX + event_id,
        occurred_at=occurred_at,
        input_event_id=event_id,
        input_type=kind if isinstance(kind, str) else "",
        pool=pool,
        outcome="REJECTED",
        reason=reason[:4096],
        job_id=job_id if isinstance(job_id, str) else None,
    )
