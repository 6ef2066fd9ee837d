"""The gateway's log tail (``gateway.log_tail.LogProjector``) when the log does not continue what it
folded (issue #30): it rebuilds from the log, or says it cannot (liveness), never freezes."""

from __future__ import annotations

import pytest

from gpuquota.adapters.event_store import InMemoryEventStore, Record, TransientStoreError
from gpuquota.core import decide, evolve, fingerprint, replay
from gpuquota.gateway.log_tail import LogProjector
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import Projector
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from tests.builders import Harness, job

POOL = "default"


async def record_all(store: InMemoryEventStore, h: Harness) -> None:
    for message, events in h.decisions[await store.last_seq(POOL) :]:
        await store.append(POOL, await store.last_seq(POOL), message, events)


def cut(store: InMemoryEventStore, keep: int) -> None:
    """The log loses its end: only the first ``keep`` records stay (a crash without durable commits)."""
    lost = store.logs[POOL][keep:]
    del store.logs[POOL][keep:]
    store.seen[POOL] -= {r.input.event_id for r in lost}


def statuses(read_model: ReadModel) -> dict[str, str]:
    return {job_id: view.status.value for job_id, view in read_model.jobs.items()}


async def test_a_log_that_lost_its_end_and_went_on_differently_is_folded_again() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("b").share("QS2"))
    store = InMemoryEventStore()
    await record_all(store, h)
    keep = await store.last_seq(POOL)
    h.running("a").succeed("a")
    await record_all(store, h)
    projector = LogProjector(store, Projector(), POOL)
    await projector.catch_up()
    assert statuses(projector.read_model)["a"] == "SUCCEEDED"
    live = projector.read_model

    # the database lost the last records; the scheduler went on from the shorter log
    cut(store, keep)
    state = replay(e for r in store.logs[POOL] for e in r.events)
    message = inp.TerminateJob(event_id="again-1", occurred_at=h.now + 5, job_id="a", reason="x")
    events = decide(state, message)
    for event in events:
        evolve(state, event)
    await store.append(POOL, keep, message, events)

    await projector.catch_up()
    assert projector.rebuilds == 1 and projector.failure is None
    assert projector.read_model is live  # swapped in place: every holder sees the rebuilt one
    fresh = ReadModel()
    for record in store.logs[POOL]:
        for event in record.events:
            fresh.apply(event)
    assert statuses(projector.read_model) == statuses(fresh)
    assert statuses(projector.read_model)["a"] != "SUCCEEDED"
    assert fingerprint(projector.state) == fingerprint(state)
    assert projector.seq == keep + 1


async def test_a_record_that_cannot_be_applied_even_from_the_start_fails_liveness() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"))
    store = InMemoryEventStore()
    await record_all(store, h)
    projector = LogProjector(store, Projector(), POOL)
    await projector.catch_up()
    bad = ev.JobSucceeded(event_id="e-bad", occurred_at=h.now + 1, job_id="nobody", attempt_id="nobody#1")
    message = inp.Tick(event_id="tick-bad", occurred_at=h.now + 1)
    await store.append(POOL, await store.last_seq(POOL), message, [bad])

    assert await projector.catch_up() == 0
    assert projector.failure is not None and "cannot be rebuilt" in projector.failure


class FlakyStore(InMemoryEventStore):
    """Reads fail (transiently) while ``down``."""

    down = False

    async def read(self, pool: str, after_seq: int = 0, limit: int = 10_000) -> list[Record]:
        if self.down:
            raise TransientStoreError("postgres: ConnectionRefusedError(111)")
        return await super().read(pool, after_seq, limit)


async def test_a_log_cut_short_is_folded_again_once_the_store_answers() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"))
    store = FlakyStore()
    await record_all(store, h)
    keep = await store.last_seq(POOL)
    h.running("a").succeed("a")
    await record_all(store, h)
    projector = LogProjector(store, Projector(), POOL)
    await projector.catch_up()

    cut(store, keep)  # nothing written after the cut yet: the projection is ahead of the log
    store.down = True
    with pytest.raises(TransientStoreError):
        await projector.catch_up()
    store.down = False
    assert await projector.catch_up() == keep
    assert projector.rebuilds == 1 and projector.seq == keep
    assert statuses(projector.read_model)["a"] != "SUCCEEDED"  # as the shorter log says
