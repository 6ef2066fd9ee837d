"""When the node agent's records reach ``state.json``: as rarely as the durability rules allow.

Writing the whole file for every change (five times per attempt) cost a busy node more than its
launches. Changes now fall into three kinds:

- **before a launch** (``durable``): the attempt's record is on disk before its process starts, so a
  restarted agent looks for it. Every launch that waits in the same turn of the event loop shares one
  write (a wave of ``RunAttempt`` commands costs one write, not one each).
- **before a send** (``changed(before_send=True)``): a final report is on disk before it is sent, so a
  restarted agent sends it again if its delivery was not confirmed. The sender calls ``before_send``
  before each batch it sends: one write covers every final report of the batch.
- **in a while** (``changed()``): what a restart can do without (the pid after a launch: the exit
  wrapper's pid file names it too; an attempt forgotten after its final report was delivered: it would
  be reported again, and the scheduler takes reports idempotently). Written within ``delay`` seconds,
  or with the next write of another kind, whichever comes first.

``save`` writes now (start-up, stop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class StateSaver:
    def __init__(self, write: Callable[[], None], delay: float = 0.05) -> None:
        self._write = write
        self._delay = delay
        self._dirty = False
        self._before_send = False
        self._timer: asyncio.TimerHandle | None = None
        self._commit: asyncio.Future[None] | None = None
        self.writes = 0
        """Writes so far (tests and diagnosis)."""

    @property
    def pending(self) -> bool:
        """A change is not on disk yet."""
        return self._dirty

    def save(self) -> None:
        """Writes the records now (whether or not anything changed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._dirty = self._before_send = False
        self._write()
        self.writes += 1

    def flush(self) -> None:
        """Writes what is not on disk yet."""
        if self._dirty:
            self.save()

    def changed(self, before_send: bool = False) -> None:
        """A change to write within ``delay`` seconds, or before the next send (``before_send``)."""
        self._dirty = True
        self._before_send = self._before_send or before_send
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._timed)

    def before_send(self) -> None:
        """The sender is about to send: a change marked ``before_send`` is written first."""
        if self._before_send:
            self.save()

    async def durable(self) -> None:
        """Returns once every change made so far is on disk; callers of one loop turn share a write."""
        self._dirty = True
        if self._commit is None:
            loop = asyncio.get_running_loop()
            self._commit = loop.create_future()
            loop.call_soon(self._group_commit)
        await asyncio.shield(self._commit)

    def _timed(self) -> None:
        self._timer = None
        if self._dirty:
            self.save()

    def _group_commit(self) -> None:
        commit, self._commit = self._commit, None
        assert commit is not None
        try:
            if self._dirty:
                self.save()
        except Exception as exc:
            commit.set_exception(exc)
            commit.exception()  # retrieved here: its waiters may all have been cancelled
        else:
            commit.set_result(None)
