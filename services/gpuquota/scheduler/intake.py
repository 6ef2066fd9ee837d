"""Callers' inputs gathered into batches for a batch driver: the embedded mode's source of batches.

Theory of operation
-------------------
``put`` queues an item; one drain task (started by the first ``put``, ended when nothing is left) hands
everything queued so far to the driver as one batch (group commit: a burst of callers costs one
append) while fewer than ``depth`` batches are in flight; otherwise it waits for the oldest to settle
or, with room, for the next item. A batch that fails for good (``BatchDriver.start`` or its settling
raised) goes to ``on_failure`` with its items; ``cancel`` is called on every item still queued or in
flight when the drain task ends or is cancelled.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from gpuquota.scheduler.driver import BatchDriver

T = TypeVar("T")


class Intake(Generic[T]):
    """A queue of items drained into ``driver`` batch by batch, at most ``depth`` in flight."""

    def __init__(
        self,
        driver: BatchDriver[T, Any],
        *,
        depth: int,
        on_failure: Callable[[BaseException, list[T]], None],
        cancel: Callable[[T], None],
    ) -> None:
        self.driver = driver
        self.depth = depth
        self.on_failure = on_failure
        self.cancel = cancel
        self.queued: list[T] = []
        self.task: asyncio.Task[None] | None = None
        """The drain task, while there is anything to drain."""
        self._arrival: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self.queued.append(item)
        arrival = self._arrival
        if arrival is not None and not arrival.done():
            arrival.set_result(None)  # the drain task waits for items beside a batch in flight
        if self.task is None:
            self.task = asyncio.create_task(self._drain(), name="shell-batches")

    async def _drain(self) -> None:
        flight: deque[tuple[list[T], asyncio.Future[None]]] = deque()
        try:
            while self.queued or flight:
                if self.queued and len(flight) < self.depth:
                    batch, self.queued = self.queued, []
                    try:
                        flight.append((batch, await self.driver.start(batch)))
                    except Exception as exc:  # the store failed while folding the log
                        self.on_failure(exc, batch)
                    continue
                await self._next(flight[0][1], room=len(flight) < self.depth)
                while flight and flight[0][1].done():
                    batch, settling = flight.popleft()
                    if not settling.cancelled() and (error := settling.exception()) is not None:
                        self.on_failure(error, batch)
        finally:
            self.task = None
            await self.driver.close()
            for item in [item for batch, _ in flight for item in batch] + self.queued:
                self.cancel(item)
            self.queued = []

    async def _next(self, oldest: asyncio.Future[None], *, room: bool) -> None:
        """Wait for the oldest batch to settle or, with ``room`` for another, for the next item."""
        waits: list[asyncio.Future[Any]] = [oldest]
        if room:
            self._arrival = asyncio.get_running_loop().create_future()
            waits.append(self._arrival)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        self._arrival = None
