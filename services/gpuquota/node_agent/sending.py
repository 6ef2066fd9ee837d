"""The node agent's ordered outbox, and which of its queued inputs go out together in a batch.

Everything the agent sends goes through the outbox: an input whose ``send`` raises stays at the head and
is sent again (with back-off, ``support.retry``) before anything later, so reports arrive in order and
none is lost while the agent runs (the scheduler treats reports idempotently). While it retries a
failed send the link counts as down (``Outbox.link_down``), which is what holds the agent's heartbeats
back.

With ``send_many`` the outbox sends its head in batches (``head_batch``). A batch is sent at once (the
embedded shell records it in one group commit), and when one input of it fails, those after it may have
been delivered all the same; the outbox then sends the failed one again and everything after it (the
scheduler skips a repeated input by its event id). So that this never reorders one job's reports, a
batch holds at most one report per attempt; a registration, a drain or a deregistration goes alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuquota.support.ids import uuid7
from gpuquota.support.retry import Backoff, Failure
from gpuquota.wire.inputs import AttemptReport, SchedulerInput

log = logging.getLogger(__name__)

Send = Callable[[SchedulerInput], Awaitable[object]]
SendMany = Callable[[list[SchedulerInput]], Awaitable[list[BaseException | None]]]  # in order; None: sent

BATCH_LIMIT = 500


def stamp() -> dict[str, Any]:
    """The ``event_id`` and ``occurred_at`` of a new input, taken now."""
    now = int(time.time() * 1000)
    return {"event_id": uuid7(now), "occurred_at": now}


def head_batch(outbox: Iterable[SchedulerInput], limit: int = BATCH_LIMIT) -> list[SchedulerInput]:
    """The longest head of ``outbox`` that can be sent as one batch (at least its first input)."""
    batch: list[SchedulerInput] = []
    attempts: set[str] = set()
    for message in outbox:
        if not isinstance(message, AttemptReport):
            return batch or [message]
        if message.attempt_id in attempts or len(batch) >= limit:
            break
        attempts.add(message.attempt_id)
        batch.append(message)
    return batch


@dataclass(eq=False)
class Outbox:
    """Sends the queued inputs in order, each until it is delivered (module doc); ``run`` is its loop.

    ``before_send`` is awaited before each send (the agent's records that the head's reports need are
    then on disk); ``delivered`` is called with each input once it is sent."""

    send: Send
    """The link to the scheduler (the agent's heartbeats go over it too, past the queue)."""
    send_many: SendMany | None
    before_send: Callable[[], Awaitable[None]]
    delivered: Callable[[SchedulerInput], None]
    retry_seconds: float
    max_retry_seconds: float
    queued: deque[SchedulerInput] = field(default_factory=deque, init=False)
    link_down: bool = field(default=False, init=False)
    """The last send failed; cleared by the next one that succeeds."""
    failures: int = field(default=0, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _sending: bool = field(default=False, init=False)

    def emit(self, message: SchedulerInput) -> None:
        self.queued.append(message)
        self._wake.set()

    async def flush(self, timeout: float | None = None) -> None:
        """Waits until every queued input is delivered (raises TimeoutError after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.queued or self._sending:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("outbox not flushed")
            await asyncio.sleep(0.01)

    async def run(self) -> None:
        backoff = Backoff(SendFailed, initial=self.retry_seconds, longest=self.max_retry_seconds)
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.queued:
                await backoff.call(self._send_head, failed=self._send_failed)

    async def _send_head(self) -> None:
        """Sends the head once (a batch with ``send_many``); ``SendFailed`` names the first failure,
        sent again with what follows it."""
        self._sending = True
        try:
            head = head_batch(self.queued) if self.send_many else [self.queued[0]]
            await self.before_send()  # covers the head: reports queued meanwhile wait
            try:
                failures = await self.send_many(head) if self.send_many else (await self.send(head[0]),)
            except Exception as exc:
                raise SendFailed(exc) from exc
            for failure in failures:
                if isinstance(failure, BaseException):
                    raise SendFailed(failure) from failure
                self.link_down = False
                self.delivered(self.queued.popleft())
        finally:
            self._sending = False

    def _send_failed(self, failure: Failure) -> None:
        self.failures += 1
        self.link_down = True
        log.warning("send failed (%s); retrying in %.2f s", failure.error, failure.delay)


class SendFailed(Exception):
    """A send of the outbox's head did not all go; the message is the first failure's (retried)."""
