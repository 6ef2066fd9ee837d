"""The job lifecycle (semantics S5) as data: which events and node reports are legal in which job state.

``JOB_TRANSITIONS[event type]`` is the complete table of the events that concern one job: the statuses
the job may be in when the event is applied (``NEW``: the job is not in the state yet) and the status
it is in afterwards (``SAME``: unchanged; SUCCEEDED and FAILED jobs leave the core's state).
``evolve`` checks every job event against it (``check_transition``), so a ``decide`` that emitted an
illegal transition fails at once instead of corrupting the state.

``REPORT_TRANSITIONS[status][report]`` says what a node agent's report means for a job whose current
attempt it names: ``"apply"`` (a legal transition), ``"duplicate"`` (already applied: reports are
idempotent) or ``"stale"`` (an older report arriving late; ignored). A pair missing from the table is
an illegal transition and becomes a rejection.
"""

from __future__ import annotations

import re
from typing import Literal

from gpuquota.wire import events as ev
from gpuquota.wire.base import ExitRule, JobStatus

ReportMeaning = Literal["apply", "duplicate", "stale"]

SUCCEEDED_REASON = "Received status from SageMaker: Training job completed"
"""S9.3: a succeeded attempt's reason, as AWS writes it (``evaluateOnExit`` globs ported from AWS match)."""


def algorithm_error(detail: str) -> str:
    """S9.3: a failed attempt's reason as AWS writes it; ``detail``: exit code, signal or failure text."""
    return f"Received status from SageMaker: AlgorithmError: {detail}"


REPORT_TRANSITIONS: dict[JobStatus, dict[str, ReportMeaning]] = {
    JobStatus.SCHEDULED: {
        "STARTING": "apply",
        "RUNNING": "apply",
        "SUCCEEDED": "apply",
        "FAILED": "apply",
        "STOPPED": "apply",
    },
    JobStatus.STARTING: {
        "STARTING": "duplicate",
        "RUNNING": "apply",
        "SUCCEEDED": "apply",
        "FAILED": "apply",
        "STOPPED": "apply",
    },
    JobStatus.RUNNING: {
        "STARTING": "stale",
        "RUNNING": "duplicate",
        "SUCCEEDED": "apply",
        "FAILED": "apply",
        "STOPPED": "apply",
    },
}


class IllegalTransition(Exception):
    """An event for a job in a status its transition does not start from (a bug in ``decide``)."""


NEW = None
"""The job is not in the state yet (its ``JobAccepted``)."""
SAME = None
"""The job keeps its status."""

_QUEUED = frozenset({JobStatus.RUNNABLE})
_DISPATCHED = frozenset({JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING})
_LIVE = _QUEUED | _DISPATCHED
_ANY = _LIVE | {NEW}
"""Facts that may outlive the job: tags of a finished job, a share's blocked head that has left."""

JOB_TRANSITIONS: dict[type[ev.SchedulerEvent], tuple[frozenset[JobStatus | None], JobStatus | None]] = {
    ev.JobAccepted: (frozenset({NEW}), JobStatus.RUNNABLE),
    ev.JobDispatched: (_QUEUED, JobStatus.SCHEDULED),
    ev.JobStarting: (frozenset({JobStatus.SCHEDULED}), JobStatus.STARTING),
    ev.JobRunning: (frozenset({JobStatus.SCHEDULED, JobStatus.STARTING}), JobStatus.RUNNING),
    # from RUNNABLE too: a success the log lost, adopted from the node's report (core.lost_tail)
    ev.JobSucceeded: (_LIVE, JobStatus.SUCCEEDED),
    ev.JobFailed: (_LIVE, JobStatus.FAILED),
    ev.JobRequeued: (_DISPATCHED, JobStatus.RUNNABLE),
    ev.JobPreempted: (_DISPATCHED, SAME),
    ev.JobStopRequested: (_DISPATCHED, SAME),
    ev.AttemptPartEnded: (_DISPATCHED, SAME),
    ev.AttemptOutputsRecorded: (_DISPATCHED, SAME),
    ev.AttemptCheckpointed: (_DISPATCHED, SAME),
    ev.JobPriorityChanged: (_LIVE, SAME),
    ev.JobTagsChanged: (_ANY, SAME),
    ev.JobBlocked: (_QUEUED, SAME),
    ev.JobUnblocked: (_ANY, SAME),
}
"""Per job event: (statuses it may be applied in, the status after it)."""

JOB_SOURCES: dict[type[ev.SchedulerEvent], frozenset[JobStatus | None]] = {
    event_type: sources for event_type, (sources, _) in JOB_TRANSITIONS.items()
}


def check_transition(event: ev.SchedulerEvent, job_id: str, status: JobStatus | None) -> None:
    """Raise ``IllegalTransition`` if ``event`` may not be applied to job ``job_id`` in ``status``
    (``None``: the job is not in the state)."""
    sources = JOB_SOURCES.get(type(event))
    if sources is not None and status not in sources:
        now = status or "NEW (not in the state)"
        raise IllegalTransition(f"{event.type} for job {job_id} in status {now}")


def glob_matches(pattern: str, text: str) -> bool:
    """AWS ``evaluateOnExit`` globs: ``*`` matches any run of characters; the whole text must match."""
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


def retry_allowed(rules: tuple[ExitRule, ...], status_reason: str) -> bool:
    """S5.4: the first rule whose glob matches decides; no rule (or no match) means retry."""
    for rule in rules:
        if glob_matches(rule.on_status_reason, status_reason):
            return rule.action == "RETRY"
    return True
