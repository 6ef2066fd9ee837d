"""Start estimates for a deep queue: the sweeps run on a copy of the state in a worker thread.

A sweep (``gpuquota.sim.estimate.sweep``) feeds the core one job end at a time, and each end costs a
scheduling pass over the queue: with 10,000 waiting jobs, reaching the last one takes thousands of
passes, seconds, far more than an ``explain`` may block the scheduler. So ``BackgroundEstimator``
copies the state (a pickle: about 0.1 s at 10,000 jobs, on the caller's thread, which owns the state)
and runs both sweeps on the copy in a daemon thread, publishing each job's start as the run finds
it. An estimate answers from the run of the newest state version asked about: at once when the run
has reached the job, else after waiting for it at most ``BUDGET_S`` (then "after" the virtual time
the run has reached, as the synchronous estimate does). At most one run is in flight; a newer state
version starts a new run once it is done and as long after as it took (so that the thread, which
shares the interpreter's lock with the scheduler, sweeps at most half the time); meanwhile the
finished run answers, saying how many events and seconds old it is. ``refresh`` starts a run of a
new state version without a question (the gateway's explainer calls it twice a second once someone
has asked: ``gpuquota.sim.explainer``), so that the finished run is seldom more than a sweep old.
The copy is private to the thread: the scheduler's state is never touched.
"""

from __future__ import annotations

import gc
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpuquota.core import ClusterState
from gpuquota.read.model import ReadModel
from gpuquota.sim import estimate as sync
from gpuquota.wire.base import JobStatus


@dataclass
class Run:
    """Both sweeps of one state version, filled in by the worker thread as it goes."""

    version: tuple[int, int]
    applied: int
    estimated_at: int
    medians: dict[Any, int]
    waiting: frozenset[str]
    likely: dict[str, int] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)
    reached: list[int | None] = field(default_factory=lambda: [None, None])
    """The virtual time each sweep has reached (likely, latest), while it runs."""
    unbounded: list[int] = field(default_factory=lambda: [0, 0])
    done: list[bool] = field(default_factory=lambda: [False, False])
    failed: bool = False
    began_s: float = field(default_factory=time.perf_counter)
    ended_s: float | None = None
    """``time.perf_counter()`` when the run began and ended (in the worker)."""

    @property
    def over(self) -> bool:
        return self.failed or all(self.done)

    def knows(self, job_id: str) -> bool:
        return (job_id in self.likely or self.done[0]) and (job_id in self.latest or self.done[1])

    def answer(self, job_id: str, applied_now: int, now: int, newer_running: bool = False) -> dict[str, Any]:
        sweeps = sync.Sweeps(
            self.version,
            self.estimated_at,
            sync.Sweep(self.likely, self.unbounded[0], None if self.done[0] else self.reached[0]),
            sync.Sweep(self.latest, self.unbounded[1], None if self.done[1] else self.reached[1]),
            self.medians,
        )
        found = sweeps.answer(job_id)
        if applied_now != self.applied:
            age_s = round(max(0, now - self.estimated_at) / 1000, 1)
            found["assumptions"].append(
                f"estimated from the state {applied_now - self.applied} event(s) ago ({age_s} s ago"
                + ("; a newer estimate is running)" if newer_running else ")")
            )
        return found


FAILED_REST_S = 30.0
"""After a failed run, the next one waits at least this long (a failure is logged once per run)."""


def _resting(run: Run) -> bool:
    """Whether a new run must wait: as long after the last one as that one took."""
    if run.ended_s is None:
        return False
    rest = max(run.ended_s - run.began_s, FAILED_REST_S if run.failed else 0.0)
    return time.perf_counter() - run.ended_s < rest


def pickled(state: ClusterState) -> bytes:
    """The state's copy, with the collector off meanwhile (pickling allocates its memo as it walks
    every record, which would set off collections that walk them all again)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        if collecting:
            gc.enable()


class BackgroundEstimator:
    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.current: Run | None = None
        """The run of the newest state version asked about (in flight or done)."""
        self.finished: Run | None = None
        """The newest run that is done (answers while a newer one runs)."""

    def estimate(
        self, state: ClusterState, read_model: ReadModel, job_id: str, now: int
    ) -> dict[str, Any] | None:
        deadline = time.perf_counter() + sync.BUDGET_S
        job = state.jobs.get(job_id)
        if job is None or job.status is not JobStatus.RUNNABLE:
            return None
        run = self._run_for(state, read_model, now)
        if job_id not in run.waiting:  # submitted after the run's copy: nothing in flight knows it
            return sync.estimate(state, read_model, job_id, now)
        if run.knows(job_id):
            return run.answer(job_id, state.applied, now)
        finished = self.finished
        if finished is not None and job_id in finished.waiting and finished.knows(job_id):
            return finished.answer(job_id, state.applied, now, newer_running=not run.over)
        with self.changed:
            while not run.knows(job_id) and not run.failed:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self.changed.wait(left)
        return run.answer(job_id, state.applied, now)

    def refresh(self, state: ClusterState, read_model: ReadModel, now: int) -> None:
        """Keep the sweeps ahead of the questions: start a run of ``state`` when the newest run is of
        an older version (at most one in flight, resting as after a question). Called periodically on
        the thread that owns the state (``EstimatingExplainer.keep_ahead``), so that when someone asks,
        a finished run already knows every job that waited a sweep ago. Only a new version starts a
        run: an idle pool is not swept again (a question then redoes a run older than ``MAX_AGE_MS``)."""
        current = self.current
        if current is not None and current.version == (id(state), state.applied):
            return  # swept (or failed: a question retries it, after the rest)
        if any(len(share.queue) for share in state.shares.values()):
            self._run_for(state, read_model, now)

    def _run_for(self, state: ClusterState, read_model: ReadModel, now: int) -> Run:
        version = (id(state), state.applied)
        current = self.current
        if current is not None:
            if not current.over:
                return current  # one run at a time: it answers, however old
            fresh = now - current.estimated_at <= sync.MAX_AGE_MS
            if not current.failed and current.version == version and fresh:
                return current
            if _resting(current):
                return current  # the thread sweeps at most half the time: the scheduler needs the rest
        waiting = frozenset(j.job_id for j in state.jobs.values() if j.status is JobStatus.RUNNABLE)
        run = Run(version, state.applied, now, sync.observed_medians(read_model), waiting)
        run.reached = [now, now]
        copy = pickled(state)
        self.current = run
        threading.Thread(target=self._sweep, args=(run, copy), name="start-estimate", daemon=True).start()
        return run

    def _sweep(self, run: Run, copy: bytes) -> None:
        try:
            for index, end_of in enumerate((sync.likely_end(run.medians), sync.latest_end)):
                state: ClusterState = pickle.loads(copy)
                starts = run.likely if index == 0 else run.latest

                def publish(
                    job_id: str, at: int, index: int = index, starts: dict[str, int] = starts
                ) -> None:
                    starts[job_id] = at
                    run.reached[index] = at
                    with self.changed:
                        self.changed.notify_all()

                swept = sync.sweep(state, run.estimated_at, end_of, on_start=publish)
                run.unbounded[index] = swept.unbounded
                with self.changed:
                    run.done[index] = True
                    self.changed.notify_all()
            run.ended_s = time.perf_counter()
            self.finished = run
        except Exception:
            sync.log.exception("background start estimate failed")
            with self.changed:
                run.ended_s = time.perf_counter()
                run.failed = True
                self.changed.notify_all()
