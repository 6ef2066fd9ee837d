"""The job lifecycle (semantics S5) as data: which node reports are legal in which job state.

``REPORT_TRANSITIONS[status][report]`` says what a node agent's report means for a job whose current
attempt it names: ``"apply"`` (a legal transition), ``"duplicate"`` (already applied: reports are
idempotent) or ``"stale"`` (an older report arriving late; ignored). A pair missing from the table is
an illegal transition and becomes a rejection.
"""

from __future__ import annotations

import re
from typing import Literal

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
