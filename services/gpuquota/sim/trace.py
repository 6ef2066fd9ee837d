"""Traces (interface I8): JSON Lines, one job a line, in order of ``submitted_at``.

``{"submitted_at": seconds, "share": "QS1", "priority": 3, "unit": "ml.g5.xlarge", "instances": 1,
"duration": seconds, "exit_code": 0}``, optionally ``job_name``, ``checkpoint_every`` (seconds: a
preempted job resumes from its last checkpoint instead of from scratch) and ``preemption_retries``
(``preemptionRetriesBeforeTermination``). Reading streams the file: a trace of millions of jobs is
never held in memory. A bad line is an error that names its line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuquota.wire.base import Priority

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


class TraceJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    submitted_at: Seconds
    share: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
    priority: Priority = 0
    unit: Annotated[str, Field(min_length=1, max_length=128)]
    instances: Annotated[int, Field(ge=1)] = 1
    duration: Seconds
    exit_code: int = 0
    job_name: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    checkpoint_every: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    preemption_retries: Annotated[int, Field(ge=0)] | None = None

    def line(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), separators=(", ", ": "))


def parse_lines(lines: Iterable[str], source: str = "trace") -> Iterator[TraceJob]:
    """The jobs of a trace, in order; blank lines are skipped; submissions must not go back in time."""
    last = 0.0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            job = TraceJob.model_validate_json(text)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            detail = f"{where}: {error['msg']}" if where else str(error["msg"])
            raise TraceError(f"{source}:{number}: {detail}") from None
        if job.submitted_at < last:
            raise TraceError(
                f"{source}:{number}: submitted_at {job.submitted_at} is before the previous line's {last} "
                "(a trace is in order of submission)"
            )
        last = job.submitted_at
        yield job


def read_trace(path: str | Path) -> Iterator[TraceJob]:
    """Stream the jobs of the trace file at ``path`` ("-" is standard input)."""
    if str(path) == "-":
        import sys

        yield from parse_lines(sys.stdin, "<stdin>")
        return
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed below; a generator holds it)
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        yield from parse_lines(handle, str(path))


def write_trace(jobs: Iterable[TraceJob], out: TextIO) -> int:
    count = 0
    for job in jobs:
        out.write(job.line() + "\n")
        count += 1
    return count
