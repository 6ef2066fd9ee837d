"""When a run of ``benchmarks.pipeline`` is over: every job dispatched, or the scheduler idle.

A saturated scheduler pauses its dispatches for as long as it takes to decide the submissions queued
before the ``AttemptReport`` records that free slots (one pool's inputs are one ordered partition), and
that grows with the backlog. Ending a run after ``--drain`` seconds without a dispatch alone therefore
counted jobs as lost that the scheduler had simply not reached yet; a run ends only when neither
dispatches nor decided inputs have moved for that long.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable


async def until_idle(
    progress: Callable[[], Awaitable[Hashable]],
    finished: Callable[[], bool],
    seconds: float,
    *,
    poll: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Polls ``progress()`` (e.g. jobs dispatched and inputs decided) every ``poll`` seconds; returns True
    once ``finished()``, False once ``progress()`` has not changed for ``seconds``."""
    last: Hashable = object()
    since = clock()
    while clock() - since < seconds:
        now = await progress()
        if finished():
            return True
        if now != last:
            last, since = now, clock()
        await sleep(poll)  # polling: the scheduler and the broker give no "done" signal
    return False
