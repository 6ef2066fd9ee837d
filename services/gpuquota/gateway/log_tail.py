"""The gateway's read model in distributed mode: the pool's log in PostgreSQL, tailed and folded.

Theory of operation
-------------------
The read model must see *every* decided event, not only the job events of ``gpuquota.job-state``
(see ``gateway.kafka_port``), and the complete, ordered, durable record of them is the scheduler's
log. ``LogProjector`` tails it (``EventStore.read(pool, after_seq)``, polled every ``poll_seconds``)
and folds each record's events into the core's ``ClusterState`` (for ``explain``) with ``fold_log`` and
through the read side's ``Projector`` (``gpuquota.read.projection``, the one the embedded shell feeds
in-process) into the ``ReadModel``. The log's sequence has no gaps and is committed in order (one
writer per pool, each append requires the previous sequence), so tailing by sequence never skips a
record; a restarted gateway folds the log from the start.

**A log that does not continue the projection.** Tailing by sequence assumes the log only grows. A
database that lost its end (a crash without durable commits, a failover to an asynchronous replica, a
restore from backup) breaks that: the records after some sequence are gone, and the scheduler, which
decides again from the shorter log, writes different records at the same sequences. Folding on would
apply records to a state that never saw their predecessors (the issue #30 gateway stopped for good on
``IllegalTransition('JobRequeued ... in status NEW')``). So each poll reads from the last folded
record on and checks that the log still holds it, the same input with the same event ids
(``_identity``); a record that cannot be applied (an ``IllegalTransition``, a projection bug:
``ProjectionFailed``) counts the same. Either way the tail **rebuilds**: it folds the whole log from
the start into a fresh ``Projector`` and ``ClusterState`` and swaps them in (the read model in place,
``Projector.adopt``, so every holder sees the new one). An unreachable store only delays all this
(tried again with back-off). If the rebuild itself cannot apply the log, ``failure`` says why and the
gateway fails its liveness (``/health/live`` 503, ``GatewayService.broken``): a restart, or a fix, is
the remedy left, never a read model that silently stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuquota.adapters.event_store import EventStore, Record, TransientStoreError
from gpuquota.adapters.log_fold import fold_log
from gpuquota.core import ClusterState
from gpuquota.read.model import ReadModel
from gpuquota.read.projection import Projector
from gpuquota.support.retry import Backoff, Failure
from gpuquota.wire.events import SchedulerEvent

log = logging.getLogger(__name__)

Decision = tuple[SchedulerEvent, ...]
_PAGE = 1000
_LONGEST_WAIT = 1.0
"""Seconds at most between two tries of an unreachable store: the read model is back within about a
second of the store (a write waits for its decision for ``decision_timeout``, 5 s by default)."""


class LogRewritten(Exception):
    """The log does not continue what the projection folded (it lost its end, or was restored)."""


def _identity(record: Record) -> tuple[str, tuple[str, ...]]:
    """What the log must still hold at a folded sequence: the same input decided into the same events."""
    return record.input.event_id, tuple(event.event_id for event in record.events)


class LogProjector:
    """Folds a pool's log from the event store into a ``ReadModel``; see the module docstring."""

    def __init__(
        self, store: EventStore, projector: Projector, pool: str, *, poll_seconds: float = 0.02
    ) -> None:
        self.store = store
        self.projector = projector
        self.pool = pool
        self.poll_seconds = poll_seconds
        self.seq = 0
        self.state = ClusterState()
        """The core's state, folded from the same log, for ``explain``."""
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self._last: tuple[str, tuple[str, ...]] | None = None
        """``_identity`` of the record at ``seq``."""
        self._stale: str | None = None
        """Why the projection must be rebuilt before folding on (None: it continues the log)."""
        self.rebuilds = 0
        self.failure: str | None = None
        """Why the projection is broken for good (None: it is fine): the gateway's liveness."""

    @property
    def read_model(self) -> ReadModel:
        return self.projector.read_model

    def expect(self, input_id: str) -> asyncio.Future[Decision]:
        """A future for the events of input ``input_id``, resolved when its record is folded."""
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiters[input_id] = future
        return future

    def forget(self, input_id: str) -> None:
        future = self._waiters.pop(input_id, None)
        if future is not None and not future.done():
            future.cancel()

    async def catch_up(self) -> int:
        """Fold every record after the last one folded, rebuilding first if the log does not continue
        the projection; how many records that was. ``TransientStoreError`` is raised."""
        if self.failure is not None:
            return 0
        if self._stale is None:
            try:
                return await self._fold_on()
            except TransientStoreError:
                raise
            except Exception as exc:  # rewritten under the projection, or a record it cannot apply
                self._stale = f"{exc!r}"
                log.error("read model of pool %s: %s; rebuilding it from the log", self.pool, self._stale)
        return await self._rebuild()

    async def _fold_on(self) -> int:
        if self.seq > 0:
            held = await self.store.read(self.pool, after_seq=self.seq - 1, limit=1)
            if not held or held[0].seq != self.seq or _identity(held[0]) != self._last:
                raise LogRewritten(f"the log no longer holds the record folded at sequence {self.seq}")
        _, folded = await fold_log(
            self.store, self.pool, self.state, self.seq, after=self._folded(self.projector), page=_PAGE
        )
        return folded

    def _folded(self, projector: Projector) -> Callable[[Record], None]:
        """``fold_log``'s hook: project a folded record and answer its waiter; the position moves
        record by record."""

        def folded(record: Record) -> None:
            projector.project(record.events)
            self.seq, self._last = record.seq, _identity(record)
            waiter = self._waiters.pop(record.input.event_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(record.events)

        return folded

    async def _rebuild(self) -> int:
        """Fold the whole log into fresh projections and swap them in; how many records that was.
        ``TransientStoreError`` is raised (the next poll starts over); any other failure sets
        ``failure`` (liveness) and returns 0."""
        state, fresh = ClusterState(), Projector(ReadModel(self.read_model.arns))
        self.seq, self._last = 0, None
        try:
            _, folded = await fold_log(self.store, self.pool, state, 0, after=self._folded(fresh))
        except TransientStoreError:
            raise
        except Exception as exc:
            self.failure = f"the read model cannot be rebuilt from the log: {exc!r}"
            log.critical("read model of pool %s: %s", self.pool, self.failure, exc_info=exc)
            return 0
        self.state = state
        self.projector.adopt(fresh)
        self.rebuilds += 1
        self._stale = None
        log.warning("read model of pool %s rebuilt from %d log records", self.pool, folded)
        return folded

    async def run(self) -> None:
        """Keep folding until cancelled; an unreachable store only delays the read model: it is tried
        again with back-off (``support.retry``: from the polling interval to :data:`_LONGEST_WAIT`),
        said once when it goes away and once when it answers again."""

        def unavailable(failure: Failure) -> None:
            if failure.attempt == 1:
                log.warning(
                    "read model of pool %s: store unavailable (%s); retrying", self.pool, failure.error
                )

        def answers(_: int) -> None:
            log.warning("read model of pool %s: the store answers again", self.pool)

        backoff = Backoff(TransientStoreError, initial=self.poll_seconds, longest=_LONGEST_WAIT)
        while True:
            await backoff.call(self.catch_up, failed=unavailable, recovered=answers)
            await asyncio.sleep(self.poll_seconds)  # the polling interval of the tail
