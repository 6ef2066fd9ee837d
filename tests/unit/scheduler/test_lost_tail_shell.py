"""The distributed scheduler and a log that lost its end (issue #30): a worker that finds the log
shorter than it saw it committed fails (``LogTruncated``), and an assignment commits Kafka's offsets
back to the log's positions so that the lost inputs are read again (``scheduler.rewind``)."""

from __future__ import annotations

from typing import Any

import pytest
from faust.types import TP

from gpuquota.adapters.event_store import InMemoryEventStore, Position
from gpuquota.scheduler.loop import RetryPolicy
from gpuquota.scheduler.pipeline import LogTruncated
from gpuquota.scheduler.rewind import log_positions, rewind
from gpuquota.wire import inputs as inp
from tests.unit.scheduler.test_pipeline import TOPIC, FakePublisher, feed, pipeline, records, worked_inputs


async def test_a_worker_that_finds_the_log_shorter_than_it_saw_it_fails() -> None:
    store, publisher = InMemoryEventStore(), FakePublisher()
    inputs = worked_inputs()
    p = pipeline(store, publisher)
    await feed(p, records(inputs))
    # the database lost its last 3 records (a failover to an asynchronous replica)
    lost = store.logs["p"][-3:]
    del store.logs["p"][-3:]
    store.seen["p"] -= {r.input.event_id for r in lost}

    late = inp.TerminateJob(
        event_id="after-the-loss", occurred_at=inputs[-1].occurred_at + 10, job_id="a", reason="x"
    )
    with pytest.raises(LogTruncated, match="lost its end"):
        await p.handle(records([late], start=len(inputs))[0])
    assert len(store.logs["p"]) == len(inputs) - 3  # nothing decided on the shorter log


class FakeConsumer:
    """faust's consumer as ``rewind`` uses it: committed offsets, a commit, a seek to them."""

    def __init__(self, committed: dict[TP, int]) -> None:
        self.committed = committed
        self.seeks = 0

    async def seek_to_committed(self) -> dict[TP, int]:
        return dict(self.committed)

    async def _commit(self, offsets: dict[TP, int]) -> bool:
        self.committed.update(offsets)
        return True

    async def perform_seek(self) -> None:
        self.seeks += 1


async def test_offsets_committed_past_the_log_are_committed_back_to_its_least_position() -> None:
    store = InMemoryEventStore()
    for pool, offset in (("p", 40), ("q", 25)):  # two pools on partition 0: the least position counts
        message = inp.Tick(event_id=f"t-{pool}", occurred_at=1)
        await store.append(pool, 0, message, [], Position(TOPIC, 0, offset))
    await store.append("r", 0, inp.Tick(event_id="t-r", occurred_at=1), [], Position(TOPIC, 1, 7))
    positions = await log_positions(store, [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)], RetryPolicy(1.0))
    assert positions == {TP(TOPIC, 0): 25, TP(TOPIC, 1): 7}

    consumer: Any = FakeConsumer({TP(TOPIC, 0): 60, TP(TOPIC, 1): 7, TP(TOPIC, 2): 3})
    assert await rewind(consumer, positions) == 35
    assert consumer.committed == {TP(TOPIC, 0): 25, TP(TOPIC, 1): 7, TP(TOPIC, 2): 3}
    assert consumer.seeks == 1
    assert await rewind(consumer, positions) == 0  # nothing past the log: no commit, no seek
    assert consumer.seeks == 1
