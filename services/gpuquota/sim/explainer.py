"""The gateway's explainer: ``explain`` plus a start estimate, with sweeps kept ahead of the questions.

A sweep of a deep queue takes seconds (``gpuquota.sim.background``), longer than an ``explain`` may
wait. So once someone has asked, the gateway does not wait for the next question: ``keep_ahead()``
(a task on the gateway's event loop, the thread that owns the state) looks at the state every
``REFRESH_S`` and starts a run on a copy whenever its version has changed (one at a time, resting as
long as the last one took), for ``INTEREST_S`` after the last estimate asked for (a gateway nobody
asks spends nothing on sweeps: they would take up to half of its interpreter). A question is then
answered from the newest run that knows the job, complete, and the answer says how many events and
seconds old that run's state is. Only a job that waited in no finished run (submitted since, or the
first question of a gateway) waits for the run in flight, at most the time budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from gpuquota.core import ClusterState, Explanation, explain
from gpuquota.read.model import ReadModel
from gpuquota.sim.background import BackgroundEstimator
from gpuquota.wire.base import JobStatus

log = logging.getLogger(__name__)
REFRESH_S = 0.5
"""How often ``keep_ahead`` looks for a new state version (a look costs microseconds; a new run
costs a copy of the state, about 0.1 s at 10,000 jobs, on the event loop)."""
INTEREST_S = 300.0
"""How long after the last estimate asked for the sweeps are kept ahead of the questions."""


class EstimatingExplainer:
    """``explain(job)`` with a ``startEstimate`` for a RUNNABLE job (a callable, as the gateway's
    ``explainer``)."""

    def __init__(
        self, state: Callable[[], ClusterState], read_model: ReadModel, clock: Callable[[], int]
    ) -> None:
        self.state = state
        self.read_model = read_model
        self.clock = clock
        self.estimator = BackgroundEstimator()
        self.task: asyncio.Task[None] | None = None
        self.asked_s: float | None = None
        """``time.monotonic()`` of the last estimate asked for."""

    def __call__(self, job_id: str) -> Explanation | None:
        current, now = self.state(), self.clock()
        found = explain(current, job_id, now=now)
        if found is None or found.status != JobStatus.RUNNABLE.value:
            return found
        self.asked_s = time.monotonic()
        try:
            found_estimate = self.estimator.estimate(current, self.read_model, job_id, now)
        except Exception:  # an estimate is a courtesy: never let it break ``explain``
            log.exception("start estimate of job %s failed", job_id)
            return found
        return replace(found, estimate=found_estimate)

    def refresh(self) -> None:
        """Start a run of the current state if it is newer than the newest run and someone has asked
        lately (on the state's thread)."""
        if self.asked_s is None or time.monotonic() - self.asked_s > INTEREST_S:
            return
        try:
            self.estimator.refresh(self.state(), self.read_model, self.clock())
        except Exception:  # the estimates are a courtesy: a failed refresh must not end the task
            log.exception("refreshing the start estimates failed")

    async def keep_ahead(self, period_s: float = REFRESH_S) -> None:
        """Refresh every ``period_s`` until cancelled (the gateway's task, on its event loop)."""
        while True:
            self.refresh()
            await asyncio.sleep(period_s)

    def start(self) -> None:
        """Start ``keep_ahead`` as a task on the running event loop (the gateway's)."""
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.keep_ahead(), name="start-estimates")

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
