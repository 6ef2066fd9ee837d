"""The one back-off policy: how gpuquota waits for a dependency that does not answer (tenacity).

Every wait on an unreachable dependency is a :class:`Backoff` run by tenacity: the start-up checks
(``observe.startup.wait_for``: a TCP connection to Kafka or PostgreSQL), the scheduler's store calls
(``scheduler.loop.RetryPolicy``: its appends, reads and first connection), the gateway's tail of the log
(``gateway.log_tail.LogProjector.run``) and a node agent's outbox (``node_agent.agent``). A policy
says, and only it says:

- **what is retried** (``retry_on``): any other error is raised at once;
- **how long to wait**: ``initial`` seconds after the first failure, doubled after each next one, at
  most ``longest``; each wait shortened at random by up to ``jitter`` of itself, so that the clients
  that lost the same broker (every node agent of a pool) do not all come back in the same instant;
- **for how long** (``bound``): past ``bound`` seconds since the first try the last error is raised
  (the last wait ends at the bound, so the last try is made then); ``None``: retry on for ever;
- **what gets logged**: nothing by itself. The caller's ``failed`` hears of each failure (a
  :class:`Failure`: which one in a row, the wait before the next try, the time since the first) and
  ``recovered`` of a success after failures, and says what fits its reader: a line per try at
  start-up, one line when a store goes away and one when it is back in a long-running service.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay, stop_never

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed try, as the caller's ``failed`` hears of it."""

    error: BaseException
    attempt: int
    """1 for the first failure in a row."""
    delay: float
    """Seconds until the next try."""
    elapsed: float
    """Seconds since the first try."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """What is retried, how long to wait between tries and for how long in all; see the module."""

    retry_on: type[BaseException] | tuple[type[BaseException], ...]
    initial: float
    longest: float
    bound: float | None = None
    jitter: float = 0.1

    def delay(self, failures: int) -> float:
        """The longest wait after the ``failures``-th failure in a row, before jitter and bound."""
        return float(min(self.longest, self.initial * 2 ** (failures - 1)))

    async def call(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        failed: Callable[[Failure], None] | None = None,
        recovered: Callable[[int], None] | None = None,
    ) -> T:
        """``await fn()``, tried again after each ``retry_on`` error as the policy says; past the
        bound, the last error is raised as it is."""
        failures = 0

        def wait(state: RetryCallState) -> float:
            delay = self.delay(state.attempt_number) * (1 - self.jitter * random.random())
            if self.bound is not None:  # the last try at the bound, not a wait past it
                delay = min(delay, max(0.0, self.bound - (state.seconds_since_start or 0.0)))
            return delay

        def before_sleep(state: RetryCallState) -> None:
            nonlocal failures
            failures = state.attempt_number
            if failed is not None and state.outcome is not None and state.next_action is not None:
                error = state.outcome.exception()
                assert error is not None  # only errors are retried
                failed(Failure(error, failures, state.next_action.sleep, state.seconds_since_start or 0.0))

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(self.retry_on),
            wait=wait,
            stop=stop_never if self.bound is None else stop_after_delay(self.bound),
            before_sleep=before_sleep,
            reraise=True,
        )

        async def attempt() -> T:  # tenacity calls a plain callable (a lambda) without awaiting it
            return await fn()

        result: T = await retrying(attempt)
        if failures and recovered is not None:
            recovered(failures)
        return result
