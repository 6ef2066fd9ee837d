"""``Pipeline.handle_batch``: a pool's records of a batch are decided in order on the live state and
appended in ONE ``append_many``; the outcome must equal handling them one at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuquota.adapters.event_store import BatchEntry, InMemoryEventStore, TransientStoreError
from gpuquota.core import fingerprint, replay
from gpuquota.scheduler.pacing import snapshot_pace
from gpuquota.scheduler.pipeline import Outcome, Pipeline, PipelineFailed, SourceRecord
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import RunAttempt
from tests.builders import Harness, job
from tests.unit.scheduler.test_pipeline import TOPIC, FakePublisher, pipeline, records


class CountingStore(InMemoryEventStore):
    """Counts appends; ``append_many`` fails ``failures`` times (after committing if ``commit_first``)."""

    def __init__(self) -> None:
        super().__init__()
        self.singles = 0
        self.batches: list[int] = []
        self.failures = 0
        self.commit_first = False

    async def append(self, pool: str, expected_seq: int, *args: Any, **kwargs: Any) -> int:
        self.singles += 1
        return await super().append(pool, expected_seq, *args, **kwargs)

    async def append_many(self, pool: str, expected_seq: int, entries: Sequence[BatchEntry]) -> int:
        if self.failures:
            self.failures -= 1
            if self.commit_first:
                self.commit_first = False
                await super().append_many(pool, expected_seq, entries)
            raise TransientStoreError("connection reset")
        self.batches.append(len(entries))
        return await super().append_many(pool, expected_seq, entries)


def busy_inputs() -> list[SchedulerInput]:
    """Resources, then jobs that dispatch, run, finish and queue: every kind of publication."""
    h = Harness.worked_example()
    h.submit(*(job(f"j{i}").share(f"QS{i % 3 + 1}") for i in range(5)))
    h.running("j0").report("j0", "SUCCEEDED", exit_code=0)
    h.submit(job("late").share("QS1"))
    return h.inputs


async def one_at_a_time(inputs: list[SchedulerInput]) -> tuple[InMemoryEventStore, FakePublisher, Pipeline]:
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher)
    for item in records(inputs):
        await p.handle(item)
    return store, publisher, p


async def test_a_batch_is_decided_as_one_input_at_a_time_and_appended_once() -> None:
    inputs = busy_inputs()
    ref_store, ref_pub, ref = await one_at_a_time(inputs)

    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(inputs)
    outcomes = [*await p.handle_batch(items[:7]), *await p.handle_batch(items[7:])]

    assert outcomes == [Outcome.DECIDED] * len(inputs)
    assert (store.singles, store.batches) == (0, [7, len(inputs) - 7])
    assert await store.read("p") == await ref_store.read("p")
    assert await store.positions("p") == {(TOPIC, 0): len(inputs)}
    assert fingerprint(p.runtimes["p"].state) == fingerprint(ref.runtimes["p"].state)
    assert [r.event for r in publisher.records] == [r.event for r in ref_pub.records]
    assert publisher.commands == ref_pub.commands
    assert p.stats.decided == len(inputs) and p.stats.batches == 2


async def test_records_of_several_pools_and_dead_letters_in_one_batch() -> None:
    inputs = busy_inputs()
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)
    a, b = records(inputs[:6], pool="a"), records(inputs[:6], pool="b")
    other = [m.model_copy(update={"event_id": f"b/{m.event_id}"}) for m in inputs[:6]]
    b = records(other, pool="b")
    bad = SourceRecord(TOPIC, 1, 0, b"a", b"{not json")
    mixed = [a[0], b[0], bad, a[1], b[1], *a[2:], *b[2:]]

    outcomes = await p.handle_batch(mixed)

    assert outcomes == [Outcome.DECIDED] * 2 + [Outcome.DEAD_LETTER] + [Outcome.DECIDED] * 10
    assert sorted(store.batches) == [6, 6]
    assert [r.input for r in await store.read("a")] == inputs[:6]
    assert [r.input for r in await store.read("b")] == other
    assert len(publisher.letters) == 1


async def test_a_recorded_input_in_a_batch_is_skipped_and_the_others_are_decided() -> None:
    inputs = busy_inputs()
    ref_store, ref_pub, ref = await one_at_a_time(inputs)
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(inputs)
    await p.handle_batch(items[:8])
    # input 5 produced a second time (a client retried), consumed in the next batch
    batch = records([*inputs[8:10], inputs[5], *inputs[10:]], start=8)

    outcomes = await p.handle_batch(batch)

    assert outcomes == [Outcome.DECIDED] * 2 + [Outcome.DUPLICATE] + [Outcome.DECIDED] * len(items[10:])
    assert p.stats.duplicates == 1
    assert await store.read("p") == await ref_store.read("p")
    assert fingerprint(p.runtimes["p"].state) == fingerprint(ref.runtimes["p"].state)
    # nothing of the refused attempt was published: each job event at most once per load
    decided = [r.event.event_id for r in publisher.records]
    assert set(decided) == {r.event.event_id for r in ref_pub.records}
    assert await store.positions("p") == {(TOPIC, 0): len(inputs) + 1}


async def test_the_same_input_twice_in_one_batch_is_decided_once() -> None:
    inputs = busy_inputs()[:6]
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(inputs)
    twice = SourceRecord(TOPIC, 0, len(inputs), b"p", items[3].value)

    outcomes = await p.handle_batch([*items, twice])

    assert outcomes == [Outcome.DECIDED] * len(inputs) + [Outcome.DUPLICATE]
    assert [r.input for r in await store.read("p")] == inputs
    assert store.batches == [len(inputs)]


async def test_records_below_the_recorded_position_are_skipped_in_a_batch() -> None:
    inputs = busy_inputs()
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(inputs)
    await p.handle_batch(items[:10])

    outcomes = await p.handle_batch(items[6:])  # redelivered from an older committed offset
    assert outcomes == [Outcome.SKIPPED] * 4 + [Outcome.DECIDED] * (len(items) - 10)
    assert await store.last_seq("p") == len(inputs)


async def test_a_stale_writer_reloads_and_decides_the_batch_once() -> None:
    inputs = busy_inputs()
    store = CountingStore()
    first, second = pipeline(store, FakePublisher()), pipeline(store, FakePublisher())
    items = records(inputs)
    await first.handle_batch(items[:6])
    await second.handle_batch(items[6:8])  # another worker took the partition for a moment

    outcomes = await first.handle_batch(items[8:])

    assert outcomes == [Outcome.DECIDED] * (len(items) - 8)
    assert first.stats.stale == 1
    log = await store.read("p")
    assert [r.input for r in log] == inputs
    assert fingerprint(first.runtimes["p"].state) == fingerprint(replay(e for r in log for e in r.events))


async def test_a_batch_that_committed_before_the_connection_dropped_is_not_redone() -> None:
    inputs = busy_inputs()
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(inputs)
    await p.handle_batch(items[:6])
    store.failures, store.commit_first = 3, True

    outcomes = await p.handle_batch(items[6:])

    assert outcomes == [Outcome.DECIDED] * (len(items) - 6)
    assert p.stats.transient_errors == 3
    log = await store.read("p")
    assert [r.input for r in log] == inputs
    assert fingerprint(p.runtimes["p"].state) == fingerprint(replay(e for r in log for e in r.events))


async def test_nothing_is_published_for_a_batch_that_is_not_recorded() -> None:
    inputs = busy_inputs()
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher, store_retry_seconds=0.01, store_give_up=True)
    items = records(inputs)
    await p.handle_batch(items[:6])
    published = len(publisher.records), len(publisher.commands)
    store.failures = 10_000

    try:
        await p.handle_batch(items[6:])
    except PipelineFailed:
        pass
    else:
        raise AssertionError("the store stayed unreachable: the pipeline must fail")

    assert (len(publisher.records), len(publisher.commands)) == published
    assert await store.last_seq("p") == 6
    assert "p" not in p.runtimes  # its state ran ahead of the log: dropped, reloaded on next use
    store.failures = 0
    assert await p.handle_batch(items[6:]) == [Outcome.DECIDED] * (len(items) - 6)
    assert [r.input for r in await store.read("p")] == inputs


async def test_a_snapshot_due_inside_a_batch_is_taken_at_its_sequence() -> None:
    inputs = busy_inputs()
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher, snapshot_every=4)
    await p.handle_batch(records(inputs))
    await p.flush()

    snapshot = await store.latest_snapshot("p")
    assert snapshot is not None and snapshot.seq == len(inputs) // 4 * 4
    again = FakePublisher()
    recovered = await pipeline(store, again).runtime("p")
    assert fingerprint(recovered.state) == fingerprint(p.runtimes["p"].state)
    # what the tail after the snapshot published is published again on recovery
    tail = {e.event_id for r in await store.read("p", after_seq=snapshot.seq) for e in r.events}
    assert {r.event.event_id for r in again.records} <= tail
    assert all(isinstance(c, RunAttempt) for c in again.commands)
    assert any(isinstance(r.event, ev.JobAccepted) for r in publisher.records)


async def test_a_batch_overlapping_what_another_writer_recorded_decides_only_the_rest() -> None:
    inputs = busy_inputs()
    store = CountingStore()
    first, second = pipeline(store, FakePublisher()), pipeline(store, FakePublisher())
    items = records(inputs)
    await first.handle_batch(items[:6])
    await second.handle_batch(items[6:8])

    outcomes = await first.handle_batch(items[6:])  # its position is behind: 6 and 7 are in the log

    assert outcomes == [Outcome.DUPLICATE] * 2 + [Outcome.DECIDED] * (len(items) - 8)
    log = await store.read("p")
    assert [r.input for r in log] == inputs
    assert fingerprint(first.runtimes["p"].state) == fingerprint(replay(e for r in log for e in r.events))


async def test_heartbeats_that_decide_nothing_are_not_recorded_in_a_batch() -> None:
    inputs = busy_inputs()
    node = next(m for m in inputs if isinstance(m, inp.RegisterNode)).node_id
    at = inputs[-1].occurred_at
    beats = [inp.NodeHeartbeat(event_id=f"hb{i}", occurred_at=at + i, node_id=node) for i in range(3)]
    mixed = [*inputs[:8], beats[0], *inputs[8:10], beats[1], beats[2], *inputs[10:]]
    store, publisher = CountingStore(), FakePublisher()
    p = pipeline(store, publisher)

    outcomes = await p.handle_batch(records(mixed))

    quiet = {8, 11, 12}
    assert [i for i, o in enumerate(outcomes) if o is Outcome.QUIET] == sorted(quiet)
    assert all(o is Outcome.DECIDED for i, o in enumerate(outcomes) if i not in quiet)
    assert [r.input for r in await store.read("p")] == inputs
    assert store.batches == [len(inputs)]
    assert await store.positions("p") == {(TOPIC, 0): len(mixed)}
    assert (p.stats.quiet, p.stats.decided) == (3, len(inputs))
    assert await p.handle_batch(records(beats, start=len(mixed))) == [Outcome.QUIET] * 3
    assert p.stats.batches == 1


def test_snapshots_are_paced_by_the_time_they_held_the_loop() -> None:
    # a dump that held the loop 0.5 s: with a 5 % share, the next one no sooner than 10 s later
    assert snapshot_pace(100.0, 100.5, 0.05) == 100.5 + 10.0
    assert snapshot_pace(100.0, 100.0, 0.05) == 100.0
