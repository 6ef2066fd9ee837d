"""When a run of the pipeline benchmark ends: not while the scheduler is still deciding inputs.

On a fake clock: a saturated scheduler decides its backlog of submissions for longer than ``--drain``
without dispatching (the reports that free slots are queued behind them), then dispatches again.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.pipeline_drain import until_idle

DRAIN = 10.0
POLL = 0.25


@dataclass
class FakeScheduler:
    """Decides ``backlog`` inputs, one per poll, without a dispatch; then dispatches every job."""

    backlog: int
    total: int = 100
    now: float = 0.0
    decided: int = 0
    dispatched: int = 0
    stuck: bool = False
    """Neither decides nor dispatches."""

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.stuck:
            return
        if self.decided < self.backlog:
            self.decided += 1
        else:
            self.dispatched = self.total

    async def progress(self) -> tuple[int, int]:
        return self.dispatched, self.decided

    def finished(self) -> bool:
        return self.dispatched >= self.total

    async def run(self) -> bool:
        return await until_idle(
            self.progress, self.finished, DRAIN, poll=POLL, clock=lambda: self.now, sleep=self.sleep
        )


async def test_a_backlog_longer_than_the_drain_does_not_end_the_run() -> None:
    scheduler = FakeScheduler(backlog=int(3 * DRAIN / POLL))  # 30 s without a dispatch
    assert await scheduler.run()
    assert scheduler.dispatched == scheduler.total and scheduler.now >= 3 * DRAIN


async def test_a_scheduler_that_neither_decides_nor_dispatches_ends_the_run_after_the_drain() -> None:
    scheduler = FakeScheduler(backlog=0, stuck=True)
    assert not await scheduler.run()
    assert scheduler.dispatched == 0 and DRAIN <= scheduler.now <= DRAIN + POLL


async def test_a_finished_run_ends_at_once() -> None:
    scheduler = FakeScheduler(backlog=0, dispatched=100)
    assert await scheduler.run()
    assert scheduler.now == 0.0
