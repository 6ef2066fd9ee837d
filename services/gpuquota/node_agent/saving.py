"""When the node agent's records reach ``state.json``: as rarely as the durability rules allow, and
written by a worker thread so that the event loop only encodes them.

Writing the whole file for every change (five times per attempt), on the loop, cost a busy node more
than its launches. Changes now fall into three kinds:

- **before a launch** (``durable``): the attempt's record is on disk before its process starts, so a
  restarted agent looks for it. Every launch that waits meanwhile shares one write (a wave of
  ``RunAttempt`` commands costs one write, not one each).
- **before a send** (``changed(before_send=True)``): a final report is on disk before it is sent, so a
  restarted agent sends it again if its delivery was not confirmed. The sender awaits ``before_send``
  before each batch it sends: one write covers every final report of the batch.
- **in a while** (``changed()``): what a restart can do without (the pid after a launch: the exit
  wrapper's pid record names it too; an attempt forgotten after its final report was delivered: it would
  be reported again, and the scheduler takes reports idempotently). Written within ``delay`` seconds,
  or with the next write of another kind, whichever comes first.

Writes run one at a time (a lock), each encoding the records when it begins, so a later write always
holds later records. ``save`` writes at once on the loop (start-up); ``close`` waits for the writes
under way, then writes the last state (stop): nothing is written after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuquota.node_agent.records import AttemptBook


@dataclass(eq=False)
class StateSaver:
    book: AttemptBook
    records: Callable[[], dict[str, str]]
    """The agent's records as ``state.json`` holds them (each encoded), taken when a write begins."""
    delay: float = 0.05
    """At most this many seconds between an "in a while" change and its write."""
    writes: int = field(default=0, init=False)
    """Writes so far (tests and diagnosis)."""
    _dirty: bool = field(default=False, init=False)
    _before_send: bool = field(default=False, init=False)
    _timer: asyncio.TimerHandle | None = field(default=None, init=False)
    _commit: asyncio.Future[None] | None = field(default=None, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _tasks: set[asyncio.Future[None]] = field(default_factory=set, init=False)
    _closed: bool = field(default=False, init=False)

    @property
    def pending(self) -> bool:
        """A change is not on disk yet, or a write is under way."""
        return self._dirty or bool(self._tasks)

    def save(self) -> None:
        """Writes the records now, on the calling thread (start-up: no write is under way)."""
        self._closed = False
        self._cancel_timer()
        self._dirty = self._before_send = False
        self.book.save(self.records())
        self.writes += 1

    async def flush(self) -> None:
        """Returns once every change so far is on disk."""
        await self._write(only_if_dirty=True)

    async def close(self) -> None:
        """Waits for the writes under way, then writes the records one last time (stop)."""
        self._closed = True
        self._cancel_timer()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        async with self._lock:
            self._dirty = self._before_send = False
            self.book.save(self.records())
            self.writes += 1

    def changed(self, before_send: bool = False) -> None:
        """A change to write within ``delay`` seconds, or before the next send (``before_send``)."""
        self._dirty = True
        self._before_send = self._before_send or before_send
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self._timed)

    async def before_send(self) -> None:
        """The sender is about to send: a change marked ``before_send`` is written first, and a write
        under way (which may hold such a change) has finished."""
        if self._before_send or self._lock.locked():
            await self._write(only_if_dirty=True)

    async def durable(self) -> None:
        """Returns once every change made so far is on disk; waiting callers share one write."""
        self._dirty = True
        if self._commit is None:
            self._commit = self._track(self._write(group=True))
        await asyncio.shield(self._commit)

    async def _write(self, only_if_dirty: bool = False, group: bool = False) -> None:
        async with self._lock:
            if group:
                self._commit = None  # a change from now on needs a later write
            if only_if_dirty and not self._dirty:
                return  # a write that began after the change covered it
            self._cancel_timer()
            self._dirty = self._before_send = False
            text = self.book.encode(self.records())  # on the loop: the records are the loop's
            finished = self.book.take_finished()
            try:
                await asyncio.to_thread(self.book.write, text, finished)
            except BaseException:
                self.book.untake_finished(finished)  # the next write appends them
                raise
            self.writes += 1

    def _timed(self) -> None:
        self._timer = None
        if self._dirty and not self._closed:
            self._track(self._write(only_if_dirty=True))

    def _track(self, write: Any) -> asyncio.Future[None]:
        task: asyncio.Future[None] = asyncio.ensure_future(write)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed timed write is retried by the next one

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
