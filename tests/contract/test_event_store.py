"""One contract suite for every ``EventStore``: in-memory twin, SQLite, PostgreSQL.

The log entries are real: the inputs and events of the S8 worked example, decided by the core, so
every message type the harness produces makes the JSON round trip. PostgreSQL cases get a fresh
schema each and are marked ``integration``.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from gpuquota.adapters.event_store import (
    BatchEntry,
    DuplicateInput,
    EventStore,
    InMemoryEventStore,
    Position,
    Record,
    Snapshot,
    StaleWriter,
)
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.adapters.sqlite_store import SqliteEventStore
from gpuquota.wire import inputs as inp
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput
from tests.builders import Harness, job

Entry = tuple[SchedulerInput, tuple[SchedulerEvent, ...]]


class Backend:
    """Opens store objects on one storage; ``durable`` ones see the same data from a new object."""

    def __init__(self, name: str, opener: Callable[[], Awaitable[EventStore]], durable: bool) -> None:
        self.name = name
        self.durable = durable
        self._opener = opener
        self.opened: list[EventStore] = []

    async def open(self) -> EventStore:
        store = await self._opener()
        self.opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()


@pytest_asyncio.fixture(
    params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.integration)],
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "memory":
        shared = InMemoryEventStore()

        async def memory() -> EventStore:
            return shared

        yield Backend("memory", memory, durable=False)
    elif request.param == "sqlite":
        path = tmp_path / "events.db"
        backend = Backend("sqlite", lambda: SqliteEventStore.open(path), durable=True)
        try:
            yield backend
        finally:
            await backend.close_all()
    else:
        async for backend in _postgres(request.getfixturevalue("database_url")):
            yield backend


async def _postgres(database_url: str) -> AsyncIterator[Backend]:
    schema = f"contract_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        backend = Backend(
            "postgres", lambda: PostgresEventStore.connect(database_url, schema=schema), durable=True
        )
        try:
            yield backend
        finally:
            await backend.close_all()
            await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await admin.close()


@pytest_asyncio.fixture
async def store(backend: Backend) -> EventStore:
    return await backend.open()


@functools.cache
def _worked_example() -> tuple[Entry, ...]:
    """The S8 worked example plus jobs that dispatch, run and queue: (input, its events) pairs."""
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("b").share("QS2"), job("c").share("QS3").priority(5))
    h.running("a").submit(job("d").share("QS1").needs(1))
    return tuple(
        (m, tuple(e for e in h.events if e.event_id.rsplit("/", 1)[0] == m.event_id)) for m in h.inputs
    )


def sample_log(prefix: str = "") -> list[Entry]:
    """The example's entries with ids prefixed (ids are unique per store, across pools)."""
    entries = [
        (
            message.model_copy(update={"event_id": prefix + message.event_id}),
            tuple(e.model_copy(update={"event_id": prefix + e.event_id}) for e in events),
        )
        for message, events in _worked_example()
    ]
    tick = inp.Tick(event_id=f"{prefix}tick", occurred_at=2_000_000)
    return [*entries, (tick, ())]  # an input that decided nothing


async def append_all(store: EventStore, pool: str, entries: list[Entry]) -> list[int]:
    seqs: list[int] = []
    for message, events in entries:
        seqs.append(await store.append(pool, len(seqs), message, events))
    return seqs


def records(entries: list[Entry], first_seq: int = 1) -> list[Record]:
    return [Record(seq, m, e) for seq, (m, e) in enumerate(entries, start=first_seq)]


# ----- the contract ------------------------------------------------------------------------------


async def test_empty_pool(store: EventStore) -> None:
    assert await store.last_seq("p") == 0
    assert await store.read("p") == []
    assert await store.positions("p") == {}
    assert await store.latest_snapshot("p") is None


async def test_append_then_read_back_in_order(store: EventStore) -> None:
    log = sample_log()
    assert len(log) > 10 and any(len(events) > 1 for _, events in log)

    assert await append_all(store, "p", log) == list(range(1, len(log) + 1))

    assert await store.last_seq("p") == len(log)
    assert await store.read("p") == records(log)


async def test_read_from_a_position(store: EventStore) -> None:
    log = sample_log()
    await append_all(store, "p", log)

    assert await store.read("p", after_seq=4) == records(log)[4:]
    assert await store.read("p", after_seq=len(log)) == []


async def test_read_pages_by_limit(store: EventStore) -> None:
    log = sample_log()
    await append_all(store, "p", log)

    pages: list[list[Record]] = []
    after = 0
    while page := await store.read("p", after_seq=after, limit=4):
        pages.append(page)
        after = page[-1].seq

    assert [len(page) for page in pages[:-1]] == [4] * (len(pages) - 1)
    assert [r for page in pages for r in page] == records(log)


async def test_duplicate_input_is_refused_and_writes_nothing(store: EventStore) -> None:
    log = sample_log()
    await append_all(store, "p", log[:3])
    await store.append("p", 3, *log[3], position=Position("in", 0, 4))
    message, events = log[1]

    with pytest.raises(DuplicateInput):
        await store.append("p", 4, message, events, position=Position("in", 0, 99))

    assert await store.last_seq("p") == 4
    assert await store.read("p") == records(log[:4])
    assert await store.positions("p") == {("in", 0): 4}


async def test_stale_expected_seq_is_refused_and_writes_nothing(store: EventStore) -> None:
    log = sample_log()
    await append_all(store, "p", log[:3])

    for stale in (0, 2, 4):  # behind the log, and ahead of it
        with pytest.raises(StaleWriter):
            await store.append("p", stale, *log[3], position=Position("in", 0, 99))

    assert await store.read("p") == records(log[:3])
    assert await store.positions("p") == {}
    assert await store.append("p", 3, *log[3]) == 4  # the refused input was not recorded as seen


async def test_concurrent_appends_with_the_same_expected_seq_exactly_one_wins(backend: Backend) -> None:
    first, second = await backend.open(), await backend.open()  # separate connections when durable
    log = sample_log()
    for round_ in range(5):
        a, b = log[2 * round_], log[2 * round_ + 1]
        outcomes = await asyncio.gather(
            first.append("p", round_, *a), second.append("p", round_, *b), return_exceptions=True
        )

        wins = [o for o in outcomes if not isinstance(o, BaseException)]
        assert wins == [round_ + 1], outcomes
        assert [type(o) for o in outcomes if isinstance(o, BaseException)] == [StaleWriter]
        winner = a if outcomes[0] == round_ + 1 else b
        assert (await first.read("p", after_seq=round_)) == [Record(round_ + 1, *winner)]
    assert await second.last_seq("p") == 5


async def test_positions_are_recorded_with_appends(store: EventStore) -> None:
    log = sample_log()
    await store.append("p", 0, *log[0], position=Position("in", 0, 11))
    await store.append("p", 1, *log[1], position=Position("in", 1, 5))
    await store.append("p", 2, *log[2], position=Position("in", 0, 12))
    await store.append("p", 3, *log[3])  # e.g. a timer input: no position

    assert await store.positions("p") == {("in", 0): 12, ("in", 1): 5}


async def test_pools_at_lists_the_pools_with_a_position_on_a_partition(store: EventStore) -> None:
    await store.append("b", 0, *sample_log("b-")[0], position=Position("in", 2, 1))
    await store.append("a", 0, *sample_log("a-")[0], position=Position("in", 2, 7))
    await store.append("c", 0, *sample_log("c-")[0], position=Position("in", 3, 1))
    await store.append("d", 0, *sample_log("d-")[0])

    assert await store.pools_at("in", 2) == ["a", "b"]
    assert await store.pools_at("in", 3) == ["c"]
    assert await store.pools_at("other", 2) == []


async def test_latest_snapshot_is_the_newest_saved(store: EventStore) -> None:
    await store.save_snapshot("p", Snapshot(seq=2, schema_version=1, state=b"two"))
    newest = Snapshot(seq=5, schema_version=1, state=bytes(range(256)) * 10)
    await store.save_snapshot("p", newest)

    assert await store.latest_snapshot("p") == newest


async def test_pools_are_isolated(store: EventStore) -> None:
    log_a, log_b = sample_log("a-"), sample_log("b-")[:4]
    await append_all(store, "a", log_a)
    await append_all(store, "b", log_b)
    await store.append("c", 0, *sample_log("c-")[0], position=Position("in", 3, 7))
    await store.save_snapshot("a", Snapshot(seq=1, schema_version=1, state=b"a"))

    assert await store.read("a") == records(log_a)
    assert await store.read("b") == records(log_b)
    assert (await store.last_seq("a"), await store.last_seq("b")) == (len(log_a), 4)
    assert await store.positions("a") == {}
    assert await store.positions("c") == {("in", 3): 7}
    assert await store.latest_snapshot("b") is None


async def test_a_new_store_object_sees_everything(backend: Backend) -> None:
    if not backend.durable:
        pytest.skip(f"{backend.name} keeps nothing beyond the object")
    log = sample_log()
    writer = await backend.open()
    await append_all(writer, "p", log[:-1])
    await writer.append("p", len(log) - 1, *log[-1], position=Position("in", 0, 42))
    snapshot = Snapshot(seq=3, schema_version=1, state=b"\x00state\xff")
    await writer.save_snapshot("p", snapshot)
    await writer.close()

    reader = await backend.open()
    assert await reader.read("p") == records(log)
    assert await reader.last_seq("p") == len(log)
    assert await reader.positions("p") == {("in", 0): 42}
    assert await reader.latest_snapshot("p") == snapshot
    assert await reader.append("p", len(log), *sample_log("next-")[0]) == len(log) + 1


# ----- group commit without positions (the embedded mode's batches) ---------------------------------


def unplaced(entries: list[Entry]) -> list[BatchEntry]:
    return [(message, events, None) for message, events in entries]


async def test_append_many_without_positions_records_all_or_nothing(store: EventStore) -> None:
    log = sample_log()
    assert await store.append_many("p", 0, unplaced(log[:3])) == 3
    assert await store.append("p", 3, *log[3]) == 4
    assert await store.append_many("p", 4, unplaced(log[4:6])) == 6
    assert await store.read("p") == records(log[:6])

    for bad in ([log[6], log[1]], [log[6], log[6]]):  # recorded before; twice in the batch
        with pytest.raises(DuplicateInput):
            await store.append_many("p", 6, unplaced(bad))
    with pytest.raises(StaleWriter):
        await store.append_many("p", 5, unplaced(log[6:8]))
    assert await store.read("p") == records(log[:6])
    assert await store.append_many("p", 6, unplaced(log[6:])) == len(log)
    assert await store.read("p") == records(log)


# ----- append_many: one transaction per batch (the distributed scheduler's group commit) --------------


def batch(entries: list[Entry], partition: int = 0, first_offset: int = 0) -> list[BatchEntry]:
    """``entries`` as consumed one after another from ``partition``, from ``first_offset`` on."""
    return [
        (message, events, Position("in", partition, offset + 1))
        for offset, (message, events) in enumerate(entries, start=first_offset)
    ]


async def test_append_many_records_in_order_and_numbers_on(store: EventStore) -> None:
    log = sample_log()
    assert await store.append_many("p", 0, batch(log[:3])) == 3
    assert await store.append("p", 3, *log[3]) == 4  # single appends and batches interleave
    assert await store.append_many("p", 4, []) == 4  # nothing to record
    assert await store.append_many("p", 4, batch(log[4:], first_offset=4)) == len(log)

    assert await store.read("p") == records(log)
    assert await store.last_seq("p") == len(log)
    assert await store.read("p", after_seq=2, limit=3) == records(log)[2:5]


async def test_append_many_records_the_last_position_per_partition(store: EventStore) -> None:
    log = sample_log()
    entries: list[BatchEntry] = [
        (*log[0], Position("in", 0, 11)),
        (*log[1], Position("in", 1, 5)),
        (*log[2], Position("in", 0, 12)),
        (*log[3], None),  # e.g. a timer input
        (*log[4], Position("in", 1, 6)),
    ]
    await store.append_many("p", 0, entries)
    assert await store.positions("p") == {("in", 0): 12, ("in", 1): 6}
    assert await store.pools_at("in", 1) == ["p"]

    await store.append_many("p", 5, [(*log[5], None)])
    assert await store.positions("p") == {("in", 0): 12, ("in", 1): 6}
    await store.append_many("p", 6, [(*log[6], Position("in", 0, 13))])
    assert await store.positions("p") == {("in", 0): 13, ("in", 1): 6}


async def test_append_many_with_a_stale_expected_seq_records_nothing(store: EventStore) -> None:
    log = sample_log()
    await store.append_many("p", 0, batch(log[:3]))

    for stale in (0, 2, 4):  # behind the log, and ahead of it
        with pytest.raises(StaleWriter):
            await store.append_many("p", stale, batch(log[3:6], partition=1, first_offset=3))

    assert await store.read("p") == records(log[:3])
    assert await store.positions("p") == {("in", 0): 3}
    assert await store.recorded_inputs([m.event_id for m, _ in log[3:6]]) == set()
    assert await store.append_many("p", 3, batch(log[3:6], first_offset=3)) == 6  # not marked as seen


async def test_a_duplicate_refuses_the_whole_batch_and_is_named(store: EventStore) -> None:
    log = sample_log()
    await store.append_many("p", 0, batch(log[:4]))
    again = log[1]  # recorded before: a redelivered or re-produced input
    attempt = batch([log[4], again, log[5]], first_offset=10)

    with pytest.raises(DuplicateInput) as refused:
        await store.append_many("p", 4, attempt)
    assert str(refused.value) == again[0].event_id
    with pytest.raises(DuplicateInput):  # the same input twice in one batch
        await store.append_many("p", 4, batch([log[4], log[5], log[4]], first_offset=10))

    assert await store.read("p") == records(log[:4])
    assert await store.positions("p") == {("in", 0): 4}
    ids = [message.event_id for message, _, _ in attempt]
    assert await store.recorded_inputs(ids) == {again[0].event_id}
    # the caller drops what is recorded and appends the rest
    rest = [entry for entry in attempt if entry[0].event_id not in {again[0].event_id}]
    assert await store.append_many("p", 4, rest) == 6
    assert await store.read("p") == records([*log[:4], log[4], log[5]])
    assert await store.positions("p") == {("in", 0): 13}


async def test_recorded_inputs_answers_across_pools(store: EventStore) -> None:
    a, b = sample_log("a-"), sample_log("b-")
    await store.append_many("a", 0, batch(a[:2]))
    await store.append("b", 0, *b[0])

    ids = [a[0][0].event_id, a[1][0].event_id, a[2][0].event_id, b[0][0].event_id, "never"]
    assert await store.recorded_inputs(ids) == set(ids[:2]) | {ids[3]}
    assert await store.recorded_inputs([]) == set()


async def test_concurrent_batches_with_the_same_expected_seq_exactly_one_wins(backend: Backend) -> None:
    first, second = await backend.open(), await backend.open()
    log = sample_log()
    await first.append_many("p", 0, batch(log[:2]))
    mine, theirs = batch(log[2:5], first_offset=2), batch(log[5:8], partition=1, first_offset=5)

    outcomes = await asyncio.gather(
        first.append_many("p", 2, mine), second.append_many("p", 2, theirs), return_exceptions=True
    )

    assert [o for o in outcomes if not isinstance(o, BaseException)] == [5], outcomes
    assert [type(o) for o in outcomes if isinstance(o, BaseException)] == [StaleWriter]
    winner = log[2:5] if outcomes[0] == 5 else log[5:8]
    assert await second.read("p") == records([*log[:2], *winner])


async def test_a_long_batch_is_one_append(store: EventStore) -> None:
    ticks: list[Entry] = [(inp.Tick(event_id=f"t{i}", occurred_at=i), ()) for i in range(1500)]
    assert await store.append_many("p", 0, batch(ticks)) == 1500
    assert await store.positions("p") == {("in", 0): 1500}
    assert len(await store.recorded_inputs([m.event_id for m, _ in ticks])) == 1500
    with pytest.raises(DuplicateInput):
        await store.append_many("p", 1500, batch([*sample_log()[:1], ticks[1499]]))
    assert await store.last_seq("p") == 1500
