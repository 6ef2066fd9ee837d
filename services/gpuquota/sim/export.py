"""``gpuquota trace export``: the trace of a recorded log, with the durations the jobs really ran.

A job's duration is that of its last attempt (from its dispatch to its end: a preempted job ran again
from the start, as jobs without checkpoints do); a job that failed by preemption, or still runs when
the log ends, gets its longest attempt (a lower bound). Jobs that never ran are left out (their
duration is unknown); so are jobs rejected at submission. Times are seconds after the first
submission, and the submitted priority is kept (later priority updates are not in the trace format).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpuquota.adapters.event_store import EventStore, Record
from gpuquota.sim.trace import TraceJob
from gpuquota.wire import events as ev
from gpuquota.wire.base import JobSpec

PAGE = 10_000
EXIT_CODE = re.compile(r"exited with code (-?\d+)")


@dataclass
class Observed:
    spec: JobSpec
    submitted: int
    attempt_start: int | None = None
    last_attempt: int | None = None
    longest: int = 0
    exit_code: int | None = None
    finished: bool = False

    def end_attempt(self, at: int) -> None:
        if self.attempt_start is not None:
            self.last_attempt = at - self.attempt_start
            self.longest = max(self.longest, self.last_attempt)
            self.attempt_start = None


@dataclass
class Exported:
    jobs: list[TraceJob]
    never_ran: int
    unfinished: int


@dataclass
class Recorder:
    queue: str | None = None
    jobs: dict[str, Observed] = field(default_factory=dict)
    last_time: int = 0

    def fold(self, event: ev.SchedulerEvent) -> None:
        self.last_time = max(self.last_time, event.occurred_at)
        if isinstance(event, ev.JobAccepted):
            if self.queue is None or event.job.job_queue == self.queue:
                self.jobs[event.job.job_id] = Observed(event.job, event.occurred_at)
            return
        job_id = getattr(event, "job_id", None)
        job = None if job_id is None else self.jobs.get(job_id)
        if job is None:
            return
        if isinstance(event, ev.JobDispatched):
            job.attempt_start = event.occurred_at
        elif isinstance(event, ev.JobRequeued):
            job.end_attempt(event.occurred_at)
        elif isinstance(event, ev.JobSucceeded | ev.JobFailed):
            job.end_attempt(event.occurred_at)
            job.finished = True
            job.exit_code = _exit_code(event)

    def result(self) -> Exported:
        out: list[TraceJob] = []
        never_ran = unfinished = 0
        first = min((j.submitted for j in self.jobs.values()), default=0)
        for job in sorted(self.jobs.values(), key=lambda j: (j.submitted, j.spec.job_id)):
            if not job.finished:
                job.end_attempt(self.last_time)  # still running when the log ends
            if job.last_attempt is None:
                never_ran += 1
                continue
            unfinished += not job.finished
            preempted = job.finished and job.exit_code is None
            duration = job.last_attempt if job.finished and not preempted else job.longest
            out.append(_trace_job(job, (job.submitted - first) / 1000, duration / 1000))
        return Exported(out, never_ran, unfinished)


def _exit_code(event: ev.JobSucceeded | ev.JobFailed) -> int | None:
    """0 for success, the container's code for a failure, None for a stop (preemption, termination)."""
    if isinstance(event, ev.JobSucceeded):
        return 0
    if event.preempted or event.is_terminated:
        return None
    found = EXIT_CODE.search(event.status_reason)
    return int(found.group(1)) if found else 1


def _trace_job(job: Observed, submitted_at: float, duration: float) -> TraceJob:
    spec = job.spec
    return TraceJob(
        submitted_at=submitted_at,
        share=spec.quota_share,
        priority=spec.priority,
        unit=spec.unit,
        instances=spec.count,
        duration=duration,
        exit_code=job.exit_code or 0,
        job_name=spec.job_name,
        preemption_retries=spec.preemption_retries,
    )


async def records(store: EventStore, pool: str) -> AsyncIterator[Record]:
    after = 0
    while True:
        page = await store.read(pool, after_seq=after, limit=PAGE)
        if not page:
            return
        for record in page:
            yield record
        after = page[-1].seq


async def export_store(store: EventStore, pool: str = "default", queue: str | None = None) -> Exported:
    recorder = Recorder(queue)
    async for record in records(store, pool):
        fold_all(recorder, record.events)
    return recorder.result()


def fold_all(recorder: Recorder, events: Iterable[ev.SchedulerEvent]) -> None:
    for event in events:
        recorder.fold(event)


async def open_log(data_dir: str | None, database_url: str | None) -> EventStore:
    if data_dir is not None:
        from gpuquota.adapters.sqlite_store import STORE_FILE, SqliteEventStore

        path = Path(data_dir) / STORE_FILE
        if not path.exists():
            raise FileNotFoundError(f"no recorded log at {path}")
        return await SqliteEventStore.open(path)
    from gpuquota.adapters.postgres_store import PostgresEventStore

    assert database_url is not None
    return await PostgresEventStore.connect(database_url, migrate=False)
