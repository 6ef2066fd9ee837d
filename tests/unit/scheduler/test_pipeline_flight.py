"""Two batches in flight (``Pipeline.start_batch``, ``scheduler.driver``): the next batch of a pool is
stepped while the one before is being appended; appends stay in log order, publications in decision
order, and a batch whose state was dropped before it was recorded is decided again after the redo of
the one before. The outcome must equal handling the records one at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gpuquota.adapters.event_store import BatchEntry, InMemoryEventStore, TransientStoreError
from gpuquota.core import fingerprint, replay
from gpuquota.scheduler.pipeline import Outcome, Pipeline, PipelineFailed, SourceRecord
from tests.unit.scheduler.test_pipeline import TOPIC, FakePublisher, pipeline, records
from tests.unit.scheduler.test_pipeline_batches import busy_inputs, one_at_a_time


class GatedStore(InMemoryEventStore):
    """``hold()``: the next ``append_many`` waits until ``release()``; every append is logged in order."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[int, int]] = []
        """(expected sequence, entries) of every append that reached the store, in order."""
        self.gate: asyncio.Event | None = None
        self.opened = asyncio.Event()
        self.waiting = asyncio.Event()
        self.failures = 0

    def hold(self) -> None:
        self.gate = self.opened = asyncio.Event()
        self.waiting = asyncio.Event()

    def release(self) -> None:
        self.opened.set()

    async def append_many(self, pool: str, expected_seq: int, entries: Sequence[BatchEntry]) -> int:
        gate, self.gate = self.gate, None
        if gate is not None:
            self.waiting.set()
            await gate.wait()
        if self.failures:
            self.failures -= 1
            raise TransientStoreError("connection reset")
        self.appends.append((expected_seq, len(entries)))
        return await super().append_many(pool, expected_seq, entries)


async def test_the_next_batch_is_stepped_while_one_is_appended_and_recorded_after_it() -> None:
    inputs = busy_inputs()
    ref_store, ref_pub, ref = await one_at_a_time(inputs)
    store, publisher = GatedStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(inputs)
    store.hold()

    first = await p.start_batch(items[:7])
    await asyncio.wait_for(store.waiting.wait(), 5)
    second = await p.start_batch(items[7:])  # stepped now, on the state the first left
    assert p.runtimes["p"].seq == len(inputs) and store.appends == [] and not publisher.records
    store.release()

    assert [*await first, *await second] == [Outcome.DECIDED] * len(inputs)
    assert store.appends == [(0, 7), (7, len(inputs) - 7)]
    assert await store.read("p") == await ref_store.read("p")
    assert await store.positions("p") == {(TOPIC, 0): len(inputs)}
    assert fingerprint(p.runtimes["p"].state) == fingerprint(ref.runtimes["p"].state)
    assert [r.event for r in publisher.records] == [r.event for r in ref_pub.records]
    assert publisher.commands == ref_pub.commands


async def test_a_batch_stepped_on_a_state_that_was_dropped_is_decided_again_after_the_redo() -> None:
    inputs = busy_inputs()
    store = GatedStore()
    first_publisher = FakePublisher()
    first, other = pipeline(store, first_publisher), pipeline(store, FakePublisher())
    items = records(inputs)
    await first.handle_batch(items[:6])
    store.hold()

    a = await first.start_batch(items[6:9])  # its append waits
    await asyncio.wait_for(store.waiting.wait(), 5)
    b = await first.start_batch(items[9:])  # stepped on the state a left
    await other.handle_batch(items[6:8])  # another worker took the partition for a moment
    store.release()  # a finds two of its inputs recorded: reload, decide the rest again; b after it

    assert await a == [Outcome.DUPLICATE, Outcome.DUPLICATE, Outcome.DECIDED]
    assert await b == [Outcome.DECIDED] * (len(items) - 9)
    assert (first.stats.duplicates, first.stats.loads) == (2, 2)
    log = await store.read("p")
    assert [r.input for r in log] == inputs
    assert fingerprint(first.runtimes["p"].state) == fingerprint(replay(e for r in log for e in r.events))
    recorded = {e.event_id for r in log for e in r.events}
    assert {r.event.event_id for r in first_publisher.records} <= recorded  # nothing unrecorded published


async def test_one_input_waits_for_the_batch_in_flight() -> None:
    inputs = busy_inputs()
    ref_store, _, _ = await one_at_a_time(inputs)
    store = GatedStore()
    p = pipeline(store, FakePublisher())
    items = records(inputs)
    store.hold()

    batch = await p.start_batch(items[:-1])
    await asyncio.wait_for(store.waiting.wait(), 5)
    single = asyncio.ensure_future(p.handle(items[-1]))
    await asyncio.sleep(0)  # let it run up to its wait for the batch in flight
    assert not single.done()
    store.release()

    assert [*await batch, await single] == [Outcome.DECIDED] * len(inputs)
    assert await store.read("p") == await ref_store.read("p")


async def test_a_batch_that_fails_for_good_fails_the_batch_after_it() -> None:
    inputs = busy_inputs()
    store = GatedStore()
    p = pipeline(store, FakePublisher(), store_retry_seconds=0.0, store_give_up=True)
    items = records(inputs)
    store.hold()
    store.failures = 1_000

    a = await p.start_batch(items[:6])
    await asyncio.wait_for(store.waiting.wait(), 5)
    b = await p.start_batch(items[6:])
    store.release()

    with pytest.raises(PipelineFailed):
        await a
    with pytest.raises(PipelineFailed, match="an earlier batch failed"):
        await b
    assert await store.read("p") == []


async def test_flush_waits_for_the_batches_in_flight() -> None:
    inputs = busy_inputs()
    store, publisher = GatedStore(), FakePublisher()
    p: Pipeline = pipeline(store, publisher)
    store.hold()
    settling = await p.start_batch(records(inputs))
    await asyncio.wait_for(store.waiting.wait(), 5)
    flushed = asyncio.ensure_future(p.flush())
    await asyncio.sleep(0)
    assert not flushed.done()
    store.release()
    await asyncio.wait_for(flushed, 5)
    assert settling.done() and len(await store.read("p")) == len(inputs)


async def test_one_input_left_of_a_batch_is_decided_alone_and_its_duplicate_costs_no_reload() -> None:
    inputs = busy_inputs()
    p = pipeline(GatedStore(), FakePublisher())
    items = records(inputs)
    await p.handle_batch(items)
    copy = SourceRecord(TOPIC, 0, len(items), b"p", items[-1].value)  # produced twice (a retry)

    outcomes = await p.handle_batch([*items[-3:], copy])  # redelivered, with the copy after them

    assert outcomes == [Outcome.SKIPPED] * 3 + [Outcome.DUPLICATE]
    assert (p.stats.duplicates, p.stats.loads) == (1, 1)
    assert "p" in p.runtimes
