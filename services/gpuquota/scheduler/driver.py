"""THE batch driver of one pool, in both modes: step on live state, append after the batch in flight,
settle in order, redo after a failed append, rebuild from the log.

Theory of operation
-------------------
Terms:

- an **item** is the mode's own wrapper of one input: the embedded shell's input with its caller's
  answer, the distributed pipeline's Kafka record with its position and outcome;
- the **live state** (``Live``) is the pool's ``ClusterState`` with the log's sequence it stands at.
  While a batch is being written it runs ahead of the log; once that cannot be undone (a failed
  append, a step that raised) it is **dropped**, and the next use **rebuilds** it from the log (the
  port's ``live``: the whole log in the embedded mode, snapshot and tail in the distributed one);
- a **flight** is a batch stepped on the live state whose append and settling are still to come;
  at most two are in flight (the caller starts the next once one has settled);
- to **settle** a recorded batch is the mode's business (the port's ``settle``): answers, the read
  model and publications in the embedded mode; outcomes, positions, publications and snapshots in the
  distributed one;
- the **serial path** decides inputs with their appends awaited (``loop.decide_one``: the state changes
  only once an input is recorded, so a failure costs no rebuild), one at a time or as one batch.

Phases of a batch (``start``):

1. **step**: if the batch in flight was stepped on the same live state, the new batch is stepped at
   once on the state it left (``_step``); otherwise, or for a batch the port sends down the serial
   path (``Port.serial``: a lone input, a store that refuses writes), it waits for the one in flight.
2. **append**: after the batch in flight: at once when the store runs appends in order
   (``Mode.appends_at_once``; the second names the sequence the first ends at and fails as a stale
   writer if that is never reached), else once the one before has settled.
3. **settle** strictly in log order, each batch only once its own append committed (``_commit``):
   nothing acts on or answers an input before it is recorded.
4. **redo** after a failed append (``_redo``): the live state is dropped, the port notes the failure
   (``append_failed``: raise to fail the batch for good), the appends started after it are waited
   for (they must fail), and the batch's inputs are decided again on the serial path on the rebuilt
   state, and so are the later batches' (their state was wrong). A batch after one that failed for
   good, or after the port failed (``Port.failure``), is abandoned (``Port.abandon``). A stale writer
   on the serial path rebuilds and tries again, at most ``_STALE_RETRIES`` times in a row, while the
   port still owns the inputs (``Port.disowned``).
5. **rebuild** is the port's ``live()`` after a drop.

Four behaviours differ between the modes, each for a reason of its own (``Mode``):

- *append timing*: the embedded store (SQLite, one writer) runs appends in order, so the next batch's
  append starts at once; PostgreSQL takes appends on several connections in any order, so the
  distributed mode appends a batch only after the one before has settled.
- *redo*: the embedded mode redoes one input at a time, because each input has a caller waiting for
  its own answer (a duplicate or a refused write fails only its input); the distributed mode redoes
  the rest of a batch as one batch (its duplicates are marked by the port first), because Kafka
  records have no callers and a reload is expensive.
- *rebuild*: the port's (the embedded mode folds its whole log; the distributed mode loads the latest
  snapshot and the tail, republishing the tail).
- *step failure* (a bug in the core, ``Mode.step_errors_fail``): the embedded mode settles the batch
  in flight, rebuilds, re-applies the inputs stepped before it and answers the input with the error
  (its caller sees it; the rest of the batch goes on); the distributed mode drops the state and fails
  the batch: the worker stops and its restart decides the record again, rather than leaving a Kafka
  record without a decision or an answer.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gpuquota.adapters.event_store import DuplicateInput, Position, StaleWriter
from gpuquota.core import ClusterState, evolve
from gpuquota.scheduler.loop import Answerer, Appender, LoopFailed, StepBatch, decide_one
from gpuquota.wire.inputs import SchedulerInput

T = TypeVar("T")
LiveT = TypeVar("LiveT", bound="Live")

_STALE_RETRIES = 3
"""Stale writers in a row on the serial path before the driver gives up (another writer keeps going)."""


class Live(Protocol):
    """The pool's live state: its ``ClusterState`` and the log's sequence it stands at."""

    state: ClusterState
    seq: int
    dropped: bool
    """Ahead of the log or wrong: the next ``Port.live`` rebuilds it."""
    lock: asyncio.Lock
    """Held while the state is stepped or an input is decided on the serial path."""


@dataclass(frozen=True, slots=True)
class Settled(Generic[T]):
    """A recorded batch (or one input of the serial path) for the port to act on."""

    batch: StepBatch[T]
    seq: int | None
    """The log's last sequence after its append; None: nothing was recorded (quiet inputs only)."""
    started: float
    """``time.perf_counter()`` when it was decided (metrics)."""
    grouped: bool
    """Stepped and appended as a batch (not an input of the serial path)."""


@dataclass(frozen=True, kw_only=True)
class Mode:
    """The behaviours that differ between the modes (see the module docstring)."""

    appends_at_once: bool
    """The store runs appends in order: start the next batch's append before the one before commits."""
    redo_each: bool
    """Redo a failed batch one input at a time (else the rest of it as one batch)."""
    step_errors_fail: bool
    """A step that raises fails the batch (else only its input is answered with the error)."""


class Port(Protocol[T, LiveT]):
    """What a mode puts into the driver: where inputs come from and how they are settled."""

    mode: Mode
    answer: Answerer | None
    """The input results to publish (distributed), or None (the shell answers its callers)."""

    @property
    def failure(self) -> BaseException | None:
        """Why the mode stopped taking inputs (the batches after it are abandoned), if it did."""
        ...

    def message(self, item: T) -> SchedulerInput: ...

    def position(self, item: T) -> Position | None: ...

    def done(self, item: T) -> bool:
        """Whether the item has its outcome or answer already."""
        ...

    async def live(self) -> LiveT:
        """The live state, rebuilt from the log if it was dropped."""
        ...

    def drop(self, live: LiveT) -> None:
        """Forget ``live`` (if it is still the current state): the next ``live`` rebuilds."""
        ...

    def serial(self, items: Sequence[T]) -> bool:
        """Whether ``items`` go down the serial path instead of being stepped as a batch."""
        ...

    def todo(self, live: LiveT, items: Sequence[T]) -> list[T]:
        """The items to decide; the others are marked done (decided before, twice in the batch)."""
        ...

    def disowned(self, items: Sequence[T]) -> bool:
        """Whether the inputs are no longer this driver's to decide (then marked so)."""
        ...

    def stepped(self, live: LiveT, seq: int) -> None:
        """An input was stepped and will be recorded at ``seq`` (snapshots at exact sequences)."""
        ...

    async def settle(self, live: LiveT, settled: Settled[T]) -> None:
        """Act on a recorded batch: answers, positions, publications."""
        ...

    async def append_failed(self, live: LiveT, batch: StepBatch[T], exc: Exception) -> bool:
        """Note a batch's failed append; True: some inputs were recorded before and are now marked
        done (decide the rest again). Raise to fail the batch for good."""
        ...

    def duplicate(self, item: T) -> None:
        """The item's input was recorded before (the serial path's ``DuplicateInput``)."""
        ...

    def stale(self, exc: StaleWriter) -> None:
        """Another writer appended to the pool's log."""
        ...

    def failed(self, item: T, exc: Exception) -> None:
        """The item failed on its own (the serial path, or its step when errors do not fail):
        answer it with ``exc``, or raise to fail the batch."""
        ...

    def abandon(self, items: Sequence[T], exc: BaseException) -> None:
        """A batch before these failed for good: answer them with it, or raise."""
        ...


@dataclass(slots=True, eq=False)
class Flight(Generic[T, LiveT]):
    """A batch stepped on ``live`` whose append and settling are still to come."""

    live: LiveT
    items: list[T]
    batch: StepBatch[T] | None
    """None: decided on the serial path once the batch before has settled."""
    seq: int
    """The sequence its append follows."""
    started: float = field(default_factory=time.perf_counter)
    append: asyncio.Task[int] | None = None
    done: asyncio.Future[None] | None = None


def _settled() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


class Redo(Exception):
    """Inputs of a batch were recorded before: they are marked done; decide the rest again."""


class BatchDriver(Generic[T, LiveT]):
    """Stepping, appending, settling and redoing one pool's batches; see the module docstring."""

    def __init__(self, port: Port[T, LiveT], appender: Appender, pool: str) -> None:
        self.port = port
        self.appender = appender
        self.pool = pool
        self._flight: deque[Flight[T, LiveT]] = deque()
        """Started, not settled, in log order."""

    @property
    def busy(self) -> bool:
        """Whether a batch is in flight."""
        return bool(self._flight)

    # ----- 1. step -----------------------------------------------------------------------------

    async def start(self, items: list[T]) -> asyncio.Future[None]:
        """Step ``items`` now, behind the batch in flight if it was stepped on the same state; the
        future settles once they are recorded and settled."""
        port = self.port
        tail = self._flight[-1] if self._flight else None
        if tail is not None:
            live = await port.live()
            if tail.live is live and not port.serial(items):
                return await self._overlap(live, items, tail)
            assert tail.done is not None
            await asyncio.wait([tail.done])  # decide after it: it is being redone, or serially
        if port.serial(items):
            await self._redo(items)
            return _settled()
        return await self._overlap(await port.live(), items, None)

    async def _overlap(
        self, live: LiveT, items: list[T], before: Flight[T, LiveT] | None
    ) -> asyncio.Future[None]:
        """Step ``items`` on ``live``; append and settle them after ``before``."""
        async with live.lock:
            todo = [] if live.dropped else self.port.todo(live, items)
            if self.port.serial(todo):
                flight = Flight(live, items, None, live.seq)
            else:
                flight = await self._step(live, items, todo, before)
        if flight.batch is not None and flight.batch.entries and self.port.mode.appends_at_once:
            flight.append = asyncio.create_task(self._append(flight))
        flight.done = asyncio.ensure_future(self._commit(flight, before))
        self._flight.append(flight)
        flight.done.add_done_callback(lambda _: self._flight.remove(flight))
        return flight.done

    async def _step(
        self, live: LiveT, items: list[T], todo: list[T], before: Flight[T, LiveT] | None
    ) -> Flight[T, LiveT]:
        """Step each input of ``todo`` on the live state (ahead of the log until the append)."""
        port = self.port
        batch: StepBatch[T] = StepBatch(port.answer)
        flight = Flight(live, items, batch, live.seq)
        for item in todo:
            try:
                recorded = batch.step(flight.live.state, item, port.message(item), port.position(item))
            except Exception as exc:
                flight = await self._step_failed(flight, item, exc, before)
                if flight.batch is None:  # a batch before failed: the rest goes down the serial path
                    return flight
                continue
            if recorded:
                port.stepped(flight.live, flight.seq + len(batch.entries))
        flight.live.seq = flight.seq + len(batch.entries)
        return flight

    async def _step_failed(
        self, flight: Flight[T, LiveT], item: T, exc: Exception, before: Flight[T, LiveT] | None
    ) -> Flight[T, LiveT]:
        """A step raised: the state may have changed half-way. Fail the batch (``step_errors_fail``),
        or settle the batch before, rebuild, re-apply the inputs stepped so far and answer ``item``
        (after the batches before it were answered). If a batch before failed, this one was stepped
        on a wrong state: its inputs go down the serial path (``batch`` None)."""
        port = self.port
        if port.mode.step_errors_fail:
            port.drop(flight.live)
            raise exc
        if before is not None and before.done is not None:
            await asyncio.wait([before.done])
        wrong = flight.live.dropped or (before is not None and _failed(before))
        port.drop(flight.live)
        if wrong:
            port.failed(item, exc)
            return Flight(flight.live, flight.items, None, flight.seq, flight.started)
        live = await port.live()
        assert flight.batch is not None
        for _, events in flight.batch.decided:
            for event in events:
                evolve(live.state, event)
        port.failed(item, exc)
        return Flight(live, flight.items, flight.batch, live.seq, flight.started)

    # ----- 2. append, 3. settle ----------------------------------------------------------------

    async def _append(self, flight: Flight[T, LiveT]) -> int:
        assert flight.batch is not None
        return await self.appender.append_many(self.pool, flight.seq, flight.batch.entries)

    async def _commit(self, flight: Flight[T, LiveT], before: Flight[T, LiveT] | None) -> None:
        """Append ``flight`` after ``before``, then settle it; redo it if its state was dropped
        meanwhile or its own append failed."""
        port = self.port
        if before is not None:
            assert before.done is not None
            await asyncio.wait([before.done])
            halt = _exception(before.done) or port.failure
            if halt is not None:
                await self._unrecorded([flight])
                if flight.batch is not None and not flight.live.dropped:
                    port.drop(flight.live)
                port.abandon(flight.items, halt)
                return
        batch = flight.batch
        if batch is None or flight.live.dropped:
            await self._unrecorded([flight])
            await self._redo(flight.items)
            return
        try:
            seq = await (flight.append or self._append(flight)) if batch.entries else flight.seq
        except Exception as exc:
            port.drop(flight.live)
            try:
                await port.append_failed(flight.live, batch, exc)
            except StaleWriter as stale:  # none of the "duplicates" is recorded: another writer
                exc = stale
            if isinstance(exc, StaleWriter):
                port.stale(exc)
            await self._unrecorded(list(self._flight)[self._flight.index(flight) + 1 :])
            await self._redo(flight.items)
            return
        await port.settle(flight.live, Settled(batch, seq if batch.entries else None, flight.started, True))

    async def _unrecorded(self, flights: list[Flight[T, LiveT]]) -> None:
        """Wait for the appends ``flights`` started at once: they name a sequence the log never reached,
        so they must fail."""
        appends = [f.append for f in flights if f.append is not None]
        outcomes = await asyncio.gather(*appends, return_exceptions=True)
        if any(not isinstance(outcome, BaseException) for outcome in outcomes):
            raise LoopFailed("an append committed after one before it had failed")

    # ----- 4. redo: the serial path ------------------------------------------------------------

    async def _redo(self, items: Sequence[T]) -> None:
        """Decide the items not done yet on the serial path, on the rebuilt state, while they are
        still ours; a stale writer rebuilds and tries again."""
        port = self.port
        if port.disowned(items):
            return
        stale = 0
        while stale < _STALE_RETRIES:
            live = await port.live()  # held pools are loaded even with nothing left: their ticks go on
            rest = [item for item in items if not port.done(item)]
            if not rest:
                return
            async with live.lock:
                if live.dropped:
                    stale += 1
                    continue  # replaced while we waited for the lock
                try:
                    await self.decide_now(live, rest)
                    return
                except Redo:
                    continue  # the duplicates are marked done; the state is dropped: rebuild
                except StaleWriter as exc:
                    port.stale(exc)
                    port.drop(live)
                    stale += 1
            if port.disowned(items):
                return
        raise LoopFailed(f"pool {self.pool}: another writer keeps appending to the log")

    async def decide_now(self, live: LiveT, items: Sequence[T]) -> None:
        """Decide ``items`` on the serial path now (``live.lock`` held): one at a time, or as one
        batch whose append is awaited (``Mode.redo_each`` False)."""
        port = self.port
        todo = port.todo(live, items)
        if port.mode.redo_each or len(todo) == 1:
            for item in todo:
                if not port.done(item):
                    await self._decide_one(live, item)
        elif todo:
            await self._decide_batch(live, todo)

    async def _decide_one(self, live: LiveT, item: T) -> None:
        port = self.port
        started = time.perf_counter()
        try:
            one = await decide_one(
                self.appender,
                self.pool,
                live.seq,
                live.state,
                port.message(item),
                port.position(item),
                port.answer,
            )
        except DuplicateInput:
            port.duplicate(item)
            return
        except StaleWriter:
            raise
        except Exception as exc:
            port.failed(item, exc)
            return
        if one.seq is not None:
            live.seq = one.seq
            port.stepped(live, one.seq)
        await port.settle(live, Settled(StepBatch.of(item, one), one.seq, started, False))

    async def _decide_batch(self, live: LiveT, todo: list[T]) -> None:
        flight = await self._step(live, todo, todo, None)
        batch = flight.batch
        assert batch is not None
        try:
            seq = await self._append(flight) if batch.entries else None
        except Exception as exc:
            self.port.drop(live)
            if await self.port.append_failed(live, batch, exc):
                raise Redo() from exc
            raise
        await self.port.settle(live, Settled(batch, seq, flight.started, True))

    # ----- life cycle --------------------------------------------------------------------------

    async def flush(self) -> None:
        """Wait until no batch is in flight."""
        while pending := [f.done for f in self._flight if f.done is not None]:
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Cancel the batches in flight."""
        flights = list(self._flight)
        for flight in flights:
            for task in (flight.append, flight.done):
                if task is not None:
                    task.cancel()
        await asyncio.gather(*(f.done for f in flights if f.done is not None), return_exceptions=True)


def _exception(future: asyncio.Future[None]) -> BaseException | None:
    return None if future.cancelled() else future.exception()


def _failed(flight: Flight[T, LiveT]) -> bool:
    return flight.done is not None and flight.done.done() and _exception(flight.done) is not None
