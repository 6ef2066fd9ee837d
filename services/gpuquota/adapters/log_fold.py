"""``fold_log``: the one way a pool's log becomes state again (recovery, rebuild, the gateway's tail).

Every reader of the log folds it the same way: read the records after a sequence in pages, ``evolve``
each record's events into a ``ClusterState`` in order. What a reader needs besides the state it gets
from two hooks: ``before(state, event, record)`` just before an event is applied (what the event means
to the state it changes: node commands, job-state records to publish again) and ``after(record)`` once
a record is applied (the read model, answering a waiting caller), and ``after_page()`` once a page
is folded (recovery hands on what it collected, so a long log is never held whole).

Memory stays at one page of decoded records whatever the log's length: the store answers each
``read`` with at most ``page`` records, and nothing here keeps a record once it is folded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gpuquota.adapters.event_store import EventStore, Record
from gpuquota.core import ClusterState, evolve
from gpuquota.wire.events import SchedulerEvent

BeforeEvent = Callable[[ClusterState, SchedulerEvent, Record], None]
AfterRecord = Callable[[Record], None]
AfterPage = Callable[[], Awaitable[None]]

PAGE = 1_000
"""Records per ``read``: a page of decoded records costs about 5 MB at 1,000 (a submission and its
``JobAccepted`` carry the job's spec twice); 10,000 made the page itself a peak of recovery."""


async def fold_log(
    store: EventStore,
    pool: str,
    state: ClusterState,
    after_seq: int = 0,
    *,
    before: BeforeEvent | None = None,
    after: AfterRecord | None = None,
    after_page: AfterPage | None = None,
    page: int = PAGE,
) -> tuple[int, int]:
    """Fold the records of ``pool`` after ``after_seq`` into ``state``; ``(last seq, records folded)``."""
    seq, folded = after_seq, 0
    while records := await store.read(pool, after_seq=seq, limit=page):
        for record in records:
            if before is None:
                for event in record.events:
                    evolve(state, event)
            else:
                for event in record.events:
                    before(state, event, record)
                    evolve(state, event)
            if after is not None:
                after(record)
        seq = records[-1].seq
        folded += len(records)
        del records  # before the next page is read: one page in memory, not two
        if after_page is not None:
            await after_page()
    return seq, folded
