"""Recovery streams the log: ``fold_log`` reads it in pages, ``load_pool`` republishes page by page.

A pool loaded from its whole log must not hold the whole log (``benchmarks.recovery``: 4.1 GB for
1,000,000 events when the tail's effects were collected until the end). These tests fail if the store
is asked for the whole log at once or if the tail is republished in one piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from benchmarks.recovery import POOL, populate
from gpuquota.adapters.event_store import InMemoryEventStore, Record
from gpuquota.adapters.log_fold import PAGE, fold_log
from gpuquota.core import ClusterState
from gpuquota.scheduler.loop import JobStateRecord
from gpuquota.scheduler.recovery import load_pool
from gpuquota.wire import events as ev
from gpuquota.wire.base import JobStatus
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.node_commands import NodeCommand, RunAttempt


class CountingStore(InMemoryEventStore):
    """The in-memory twin, remembering how many records each ``read`` returned."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        records = await super().read(pool, after_seq, limit)
        self.reads.append(len(records))
        return records


class PagePublisher:
    """Keeps each ``publish`` call apart: what one page of the tail republished."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[JobStateRecord], list[NodeCommand], list[InputResult]]] = []

    async def publish(
        self,
        records: Sequence[JobStateRecord],
        commands: Sequence[NodeCommand],
        results: Sequence[InputResult] = (),
    ) -> list[Awaitable[object]]:
        self.calls.append((list(records), list(commands), list(results)))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return [done]


async def a_long_log() -> tuple[CountingStore, int]:
    store = CountingStore()
    _, inputs = await populate(store, 3 * PAGE)  # jobs dispatched, most reported, the last batch not
    store.reads.clear()
    return store, inputs


async def test_fold_log_reads_pages_and_calls_after_page_once_each() -> None:
    store, inputs = await a_long_log()
    pages = 0

    async def after_page() -> None:
        nonlocal pages
        pages += 1

    seq, folded = await fold_log(store, POOL, ClusterState(10**12), after_page=after_page)

    assert (seq, folded) == (inputs, inputs)
    assert max(store.reads) == PAGE < inputs
    assert pages == len(store.reads) - 1 == -(-inputs // PAGE)  # the last read finds nothing


async def test_load_pool_republishes_the_tail_page_by_page_and_commands_at_the_end() -> None:
    store, inputs = await a_long_log()
    publisher = PagePublisher()

    runtime, deliveries, _ = await load_pool(store, publisher, POOL, 10**12, lambda: 0)

    *pages, last = publisher.calls
    assert len(pages) == -(-inputs // PAGE) and len(deliveries) == len(publisher.calls)
    assert all(len(results) <= PAGE for _, _, results in publisher.calls)
    assert not any(commands for _, commands, _ in pages)
    # every job-state event of the log, once and in order
    log = [e for record in await store.read(POOL, limit=inputs) for e in record.events]
    published = [record.event.event_id for records, _, _ in publisher.calls for record in records]
    assert published == [e.event_id for e in log if isinstance(e, ev.JOB_STATE_EVENTS)]
    # the RunAttempt commands that still matter: the jobs still SCHEDULED at the end, each once
    runs = sorted(c.job_id for c in last[1] if isinstance(c, RunAttempt))
    scheduled = sorted(j for j, job in runtime.state.jobs.items() if job.status is JobStatus.SCHEDULED)
    assert runs == scheduled and runs
