"""The event-store port: an append-only log of (input, events) per pool, with consumer positions.

One ``append`` records one decided input atomically: the input itself, the events ``decide``
returned for it, and (in the distributed mode) the Kafka position it came from. Each pool's log has
a sequence number checked on append (``expected_seq``), so a stale owner after a rebalance cannot
write; an input whose ``event_id`` is already recorded is refused as a duplicate, which makes
redelivery harmless. ``append_many`` records several entries, in order, in ONE transaction (group
commit): all of them or none, with the same checks; ``recorded_inputs`` then tells which inputs of a
refused batch were duplicates. Snapshots bound recovery time: state = snapshot + the events after it.

Implementations: ``InMemoryEventStore`` (here, the twin for unit tests), SQLite (embedded mode) and
PostgreSQL (distributed mode); all pass ``tests/contract/test_event_store.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.inputs import SchedulerInput


class EventStoreError(Exception):
    """Base of the event store's errors."""


class StaleWriter(EventStoreError):
    """``expected_seq`` is not the pool's last sequence: another writer owns the pool now."""


class DuplicateInput(EventStoreError):
    """The input's ``event_id`` is already recorded: it was decided before (a redelivery)."""


class TransientStoreError(EventStoreError):
    """The store is unreachable; retry with a bound, then crash (nothing may act without the log)."""


class StoreWriteFailed(EventStoreError):
    """The store answers but cannot write (disk full, I/O error): the append did not commit.

    Not retried: waiting would hold every input behind this one for as long as the disk stays full.
    The inputs are refused with the reason, reads go on, and the next append that succeeds (space
    freed) ends it. Should the failed commit have reached the file after all, the same input appended
    again is a ``DuplicateInput``, so a retry with the same input never records it twice."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where an input was consumed from: the *next* offset to read after it."""

    topic: str
    partition: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """One appended entry of a pool's log."""

    seq: int
    input: SchedulerInput
    events: tuple[SchedulerEvent, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int
    """The log sequence the snapshot includes (records with ``seq`` up to this one)."""
    schema_version: int
    state: bytes


Entry = tuple[SchedulerInput, Sequence[SchedulerEvent]]
"""An input and the events decided for it: one record of the log."""

BatchEntry = tuple[SchedulerInput, Sequence[SchedulerEvent], Position | None]
"""One record of ``append_many``: an input, its events, and where it was consumed (None: nowhere)."""


class EventStore(Protocol):
    async def append(
        self,
        pool: str,
        expected_seq: int,
        message: SchedulerInput,
        events: Sequence[SchedulerEvent],
        position: Position | None = None,
    ) -> int:
        """Record ``message`` and its events as sequence ``expected_seq + 1``; return that sequence.

        Every store records through ``append_many``: a store that subclasses ``EventStore`` inherits this
        batch of one."""
        return await self.append_many(pool, expected_seq, [(message, events, position)])

    async def append_many(self, pool: str, expected_seq: int, entries: Sequence[BatchEntry]) -> int:
        """Record ``entries`` in order as sequences ``expected_seq + 1 ...`` in one transaction.

        All or nothing; returns the last sequence (``expected_seq`` when ``entries`` is empty, without
        any check). Each entry's position is recorded as with ``append``; for several entries from one
        partition the last one's counts. Raises like ``append`` and then records nothing:
        ``DuplicateInput`` (naming one such input) if any input is recorded already or appears twice in
        ``entries``; otherwise ``StaleWriter`` if ``expected_seq`` is not the pool's last sequence;
        ``TransientStoreError`` (the batch may or may not have committed).
        """
        ...

    async def recorded_inputs(self, input_ids: Sequence[str]) -> set[str]:
        """Which of ``input_ids`` are recorded already (in any pool): the duplicates of a batch."""
        ...

    async def last_seq(self, pool: str) -> int:
        """The pool's last sequence (0 for an empty log)."""
        ...

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        """Records with ``seq > after_seq`` in order, at most ``limit`` of them."""
        ...

    async def positions(self, pool: str) -> dict[tuple[str, int], int]:
        """The next offset to consume per (topic, partition), as recorded with the inputs."""
        ...

    async def pools_at(self, topic: str, partition: int) -> list[str]:
        """The pools with a recorded position on ``(topic, partition)``, sorted (scheduler recovery)."""
        ...

    async def save_snapshot(self, pool: str, snapshot: Snapshot) -> None: ...

    async def latest_snapshot(self, pool: str) -> Snapshot | None: ...

    async def close(self) -> None: ...


def first_repeated(input_ids: Sequence[str]) -> str | None:
    """The first id that occurs twice in ``input_ids`` (a batch must not hold an input twice)."""
    seen: set[str] = set()
    for input_id in input_ids:
        if input_id in seen:
            return input_id
        seen.add(input_id)
    return None


@dataclass
class InMemoryEventStore(EventStore):
    """The in-memory twin: same contract, nothing durable."""

    logs: dict[str, list[Record]] = field(default_factory=dict)
    seen: dict[str, set[str]] = field(default_factory=dict)
    cursor: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)

    async def append_many(self, pool: str, expected_seq: int, entries: Sequence[BatchEntry]) -> int:
        if not entries:
            return expected_seq
        seen = self.seen.setdefault(pool, set())
        ids = [message.event_id for message, _, _ in entries]
        repeated = first_repeated(ids)
        if repeated is not None:
            raise DuplicateInput(repeated)
        for input_id in ids:
            if input_id in seen:
                raise DuplicateInput(input_id)
        log = self.logs.setdefault(pool, [])
        if expected_seq != len(log):
            raise StaleWriter(f"pool {pool}: expected sequence {expected_seq}, log is at {len(log)}")
        for message, events, position in entries:
            log.append(Record(len(log) + 1, message, tuple(events)))
            if position is not None:
                cursor = self.cursor.setdefault(pool, {})
                cursor[(position.topic, position.partition)] = position.next_offset
        seen.update(ids)
        return len(log)

    async def recorded_inputs(self, input_ids: Sequence[str]) -> set[str]:
        wanted = set(input_ids)
        return {input_id for seen in self.seen.values() for input_id in seen & wanted}

    async def last_seq(self, pool: str) -> int:
        return len(self.logs.get(pool, []))

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        return self.logs.get(pool, [])[after_seq : after_seq + limit]

    async def positions(self, pool: str) -> dict[tuple[str, int], int]:
        return dict(self.cursor.get(pool, {}))

    async def pools_at(self, topic: str, partition: int) -> list[str]:
        return sorted(pool for pool, cursor in self.cursor.items() if (topic, partition) in cursor)

    async def save_snapshot(self, pool: str, snapshot: Snapshot) -> None:
        self.snapshots[pool] = snapshot

    async def latest_snapshot(self, pool: str) -> Snapshot | None:
        return self.snapshots.get(pool)

    async def close(self) -> None:
        pass
