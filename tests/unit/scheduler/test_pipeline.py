"""The distributed scheduler's loop body (``Pipeline``) on the in-memory store twin and a fake publisher."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest

from gpuquota.adapters.event_store import InMemoryEventStore, Position, TransientStoreError
from gpuquota.core import fingerprint
from gpuquota.scheduler.pipeline import (
    JobStateRecord,
    Outcome,
    Pipeline,
    PipelineFailed,
    PipelineSettings,
    SourceRecord,
)
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.input_results import InputResult
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt
from tests.builders import Harness, job

TOPIC = "in"


class FakePublisher:
    def __init__(self) -> None:
        self.records: list[JobStateRecord] = []
        self.commands: list[NodeCommand] = []
        self.results: list[InputResult] = []
        self.letters: list[tuple[DeadLetter, bytes | None]] = []
        self.fail_next = False

    async def publish(
        self,
        records: Sequence[JobStateRecord],
        commands: Sequence[NodeCommand],
        results: Sequence[InputResult] = (),
    ) -> list[Awaitable[object]]:
        self.records.extend(records)
        self.commands.extend(commands)
        self.results.extend(results)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if self.fail_next:
            future.set_exception(ConnectionError("broker gone"))
        else:
            future.set_result(None)
        return [future]

    async def dead_letter(self, letter: DeadLetter, key: bytes | None) -> None:
        self.letters.append((letter, key))

    def statuses(self) -> list[tuple[str, str]]:
        out = []
        for record in self.records:
            event: Any = record.event
            job_id = event.job.job_id if isinstance(event, ev.JobAccepted) else event.job_id
            out.append((job_id, str(event.status)))
        return out


class FlakyStore(InMemoryEventStore):
    """Appends fail ``failures`` times with a transient error, after committing when ``commit_first``."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0
        self.commit_first = False

    async def append(self, pool: str, expected_seq: int, *args: Any, **kwargs: Any) -> int:
        if self.failures:
            self.failures -= 1
            if self.commit_first:
                self.commit_first = False
                await super().append(pool, expected_seq, *args, **kwargs)
            raise TransientStoreError("connection reset")
        return await super().append(pool, expected_seq, *args, **kwargs)


def worked_inputs() -> list[SchedulerInput]:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("b").share("QS2"))
    return h.inputs


def records(
    messages: Sequence[SchedulerInput | bytes], start: int = 0, pool: str = "p"
) -> list[SourceRecord]:
    out = []
    for offset, message in enumerate(messages, start=start):
        value = message if isinstance(message, bytes) else message.model_dump_json().encode()
        out.append(SourceRecord(TOPIC, 0, offset, pool.encode(), value))
    return out


def pipeline(store: InMemoryEventStore, publisher: FakePublisher, **kwargs: Any) -> Pipeline:
    """A pipeline retrying at once; ``kwargs``: ``PipelineSettings`` and the constructor's own."""
    names = PipelineSettings.__dataclass_fields__
    settings = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
    settings.setdefault("retry_initial_seconds", 0.001)
    settings.setdefault("retry_max_seconds", 0.002)
    return Pipeline(store, publisher, PipelineSettings(**settings), **kwargs)


async def feed(p: Pipeline, items: Sequence[SourceRecord]) -> list[Outcome]:
    return [await p.handle(item) for item in items]


async def test_decides_records_and_publishes_job_events_and_node_commands() -> None:
    store, publisher = InMemoryEventStore(), FakePublisher()
    inputs = worked_inputs()
    outcomes = await feed(pipeline(store, publisher), records(inputs))

    assert set(outcomes) == {Outcome.DECIDED}
    assert await store.last_seq("p") == len(inputs)
    assert await store.positions("p") == {(TOPIC, 0): len(inputs)}
    assert ("a", "SCHEDULED") in publisher.statuses() and ("b", "SCHEDULED") in publisher.statuses()
    runs = [c for c in publisher.commands if isinstance(c, RunAttempt)]
    assert sorted(c.job_id for c in runs) == ["a", "b"]
    accepted = next(r for r in publisher.records if isinstance(r.event, ev.JobAccepted))
    assert accepted.share == ("jq", "QS1")


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [
        (b"{not json", b"p", "malformed JSON"),
        (b'{"type": "LaunchRockets", "event_id": "x", "occurred_at": 1}', b"p", "unknown message type"),
        (b'{"type": "UpdateJobPriority", "event_id": "x", "occurred_at": 1}', b"p", "schema violation"),
        (b'{"event_id": "x"}', b"p", "no message type"),
        (b'{"type": "Tick", "event_id": "x", "occurred_at": 1}', b"not a pool!", "invalid key"),
    ],
)
async def test_invalid_records_become_dead_letters_and_processing_continues(
    value: bytes, key: bytes, reason: str
) -> None:
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher)
    bad = SourceRecord(TOPIC, 0, 0, key, value)
    good = records(worked_inputs()[:1], start=1)[0]

    assert await p.handle(bad) is Outcome.DEAD_LETTER
    assert await p.handle(good) is Outcome.DECIDED
    ((letter, letter_key),) = publisher.letters
    assert letter.reason.startswith(reason), letter.reason
    assert (letter.value(), letter_key, letter.offset, letter.topic) == (value, key, 0, TOPIC)


async def test_redelivered_records_and_reproduced_inputs_are_not_applied_twice() -> None:
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher)
    inputs = worked_inputs()
    await feed(p, records(inputs))
    before = fingerprint(p.runtimes["p"].state)

    assert set(await feed(p, records(inputs[-3:], start=len(inputs) - 3))) == {Outcome.SKIPPED}
    again = records(inputs[-1:], start=len(inputs))  # the same input produced a second time
    assert await feed(p, again) == [Outcome.DUPLICATE]
    assert fingerprint(p.runtimes["p"].state) == before
    assert await store.last_seq("p") == len(inputs)


async def test_recovery_from_snapshot_and_tail_republishes_what_still_matters() -> None:
    store, first_pub = InMemoryEventStore(), FakePublisher()
    first = pipeline(store, first_pub, snapshot_every=8)  # a snapshot after "a" is submitted
    inputs = worked_inputs()
    await feed(first, records(inputs))
    await first.flush()
    live = fingerprint(first.runtimes["p"].state)
    snapshot = await store.latest_snapshot("p")
    assert snapshot is not None and snapshot.seq == len(inputs) - 1

    second_pub = FakePublisher()
    second = pipeline(store, second_pub, snapshot_every=8)
    await second.assigned([(TOPIC, 0)])

    assert fingerprint(second.runtimes["p"].state) == live
    # the tail after the snapshot is published again: job b's events and its RunAttempt
    assert [c.job_id for c in second_pub.commands if isinstance(c, RunAttempt)] == ["b"]
    assert ("b", "SCHEDULED") in second_pub.statuses()
    assert await second.handle(records(inputs[-1:], start=len(inputs) - 1)[0]) is Outcome.SKIPPED


async def test_recovery_does_not_resend_a_run_attempt_the_node_already_reported() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"))
    h.running("a")
    store, publisher = InMemoryEventStore(), FakePublisher()
    await feed(pipeline(store, publisher, snapshot_every=10_000), records(h.inputs))

    again = FakePublisher()
    await pipeline(store, again).assigned([(TOPIC, 0)])
    assert not [c for c in again.commands if isinstance(c, RunAttempt)]
    assert ("a", "RUNNING") in again.statuses()


async def test_a_rejected_heartbeat_of_a_lost_node_asks_it_to_register_again() -> None:
    h = Harness.basic(capacity=2, nodes=2)
    h.elapse(38_000, silent=["node-0"])
    assert not h.state.nodes["node-0"].online
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher, snapshot_every=10_000)
    await feed(p, records(h.inputs))
    beat = inp.NodeHeartbeat(event_id="beat-1", occurred_at=h.now + 1, node_id="node-0")
    assert await p.handle(records([beat], start=len(h.inputs))[0]) is Outcome.DECIDED
    (command,) = [c for c in publisher.commands if isinstance(c, RegisterAgain)]
    assert (command.node_id, command.event_id) == ("node-0", "beat-1/0")

    # recovery republishes it while the node is still lost, not once it registered again
    again = FakePublisher()
    await pipeline(store, again).assigned([(TOPIC, 0)])
    assert [c.node_id for c in again.commands if isinstance(c, RegisterAgain)] == ["node-0"]
    slots = h.state.nodes["node-0"].slots
    register = inp.RegisterNode(event_id="reg-1", occurred_at=h.now + 2, node_id="node-0", slots=slots)
    await feed(p, records([register], start=len(h.inputs) + 1))
    after = FakePublisher()
    await pipeline(store, after).assigned([(TOPIC, 0)])
    assert not [c for c in after.commands if isinstance(c, RegisterAgain)]


async def test_store_unavailable_retries_the_same_append_and_decides_once() -> None:
    store, publisher = FlakyStore(), FakePublisher()
    p = pipeline(store, publisher)
    inputs = worked_inputs()
    await feed(p, records(inputs[:-2]))

    store.failures = 3
    store.commit_first = True  # the first attempt commits, then the connection drops
    assert await p.handle(records(inputs[-2:-1], start=len(inputs) - 2)[0]) is Outcome.DECIDED
    store.failures = 2
    assert await p.handle(records(inputs[-1:], start=len(inputs) - 1)[0]) is Outcome.DECIDED

    assert p.stats.transient_errors == 5
    assert await store.last_seq("p") == len(inputs)
    reference = pipeline(store, FakePublisher())
    assert fingerprint((await reference.runtime("p")).state) == fingerprint(p.runtimes["p"].state)


async def test_store_unavailable_beyond_the_bound_fails_the_pipeline() -> None:
    store, publisher = FlakyStore(), FakePublisher()
    p = pipeline(store, publisher, store_retry_seconds=0.01, store_give_up=True)
    store.failures = 10_000
    with pytest.raises(PipelineFailed):
        await p.handle(records(worked_inputs()[:1])[0])
    assert await store.last_seq("p") == 0


async def test_a_stale_writer_rebuilds_and_decides_the_record_once() -> None:
    store = InMemoryEventStore()
    inputs = worked_inputs()
    first, second = pipeline(store, FakePublisher()), pipeline(store, FakePublisher())
    items = records(inputs)
    await feed(first, items[:-2])
    await feed(second, items[-2:-1])  # another worker took the partition for a moment

    assert await first.handle(items[-1]) is Outcome.DECIDED
    assert first.stats.stale == 1
    assert await store.last_seq("p") == len(inputs)


async def test_a_stale_writer_whose_partition_moved_stops() -> None:
    store = InMemoryEventStore()
    inputs = worked_inputs()
    items = records(inputs)
    another = records([inputs[-1].model_copy(update={"event_id": "another"})], start=len(items))
    owned = [True]
    first = pipeline(store, FakePublisher(), owns=lambda topic, partition: owned[0])
    second = pipeline(store, FakePublisher())
    await feed(first, items[:-2])
    owned[0] = False  # a rebalance gave the partition to the second worker, which writes the pool
    await feed(second, items[-2:-1])

    # its batch, stepped on the state it holds, meets the second's append: it drops the state and stops
    assert await first.handle_batch([items[-1], *another]) == [Outcome.NOT_OWNED, Outcome.NOT_OWNED]
    assert first.stats.stale == 1
    assert "p" not in first.runtimes
    # a lone input of the partition is not decided either (not even loaded)
    assert await first.handle(items[-1]) is Outcome.NOT_OWNED
    assert "p" not in first.runtimes
    assert len(await store.read("p")) == len(items) - 1  # the first's inputs and the second's one


async def test_ticks_start_after_the_grace_period_and_decide_time() -> None:
    h = Harness.basic(capacity=1)
    now = [h.now]
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher, heartbeat_timeout_ms=1000, tick_grace_seconds=0, clock=lambda: now[0])
    await feed(p, records(h.inputs))
    now[0] += 5000  # no heartbeat for 5 s from the pool's only node: every node silent at once
    await p.tick()

    # the tick decided time: the core suspends node loss (full disruption) rather than losing the node
    events = [e for r in await store.read("p") for e in r.events]
    assert [e.node_id for e in events if isinstance(e, ev.NodeLost)] == []
    assert any(isinstance(e, ev.NodeLossSuspended) for e in events)
    assert (await store.read("p"))[-1].input.type == "Tick"

    waiting = pipeline(InMemoryEventStore(), FakePublisher(), tick_grace_seconds=3600)
    await feed(waiting, records(h.inputs))
    await waiting.tick()
    assert waiting.stats.decided == len(h.inputs) and waiting.stats.quiet == 0


async def test_a_failed_publication_fails_the_pipeline() -> None:
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher)
    items = records(worked_inputs())
    await feed(p, items[:-1])
    publisher.fail_next = True
    await p.handle(items[-1])  # its JobAccepted and RunAttempt are not delivered
    await asyncio.sleep(0)  # let the failed delivery's callback run
    with pytest.raises(PipelineFailed):
        await p.handle(items[-1])


def test_positions_are_next_offsets() -> None:
    assert Position(TOPIC, 0, 5).next_offset == 5


async def test_a_keyless_record_belongs_to_the_default_pool() -> None:
    store, publisher = InMemoryEventStore(), FakePublisher()
    p = pipeline(store, publisher, default_pool="fallback")
    tick = inp.Tick(event_id="t", occurred_at=1)
    policy = worked_inputs()[0]
    for offset, message in enumerate((tick, policy)):
        await p.handle(SourceRecord(TOPIC, 0, offset, None, message.model_dump_json().encode()))
    assert await store.last_seq("fallback") == 1
