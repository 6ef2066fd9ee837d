"""gpuquota.support.retry: the one back-off policy (what is retried, waits, jitter, bound, reports)."""

from __future__ import annotations

import time

import pytest

from gpuquota.support.retry import Backoff, Failure


class Down(Exception):
    pass


class Flaky:
    """Fails with ``error`` ``failures`` times, then answers ``"ok"``."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.left = failures
        self.error = error or Down("no answer")
        self.tries = 0

    async def __call__(self) -> str:
        self.tries += 1
        if self.left:
            self.left -= 1
            raise self.error
        return "ok"


async def test_retries_what_it_is_told_and_reports_each_failure_then_the_recovery() -> None:
    failures: list[Failure] = []
    recovered: list[int] = []
    backoff = Backoff(Down, initial=0.001, longest=0.004, jitter=0.0)
    answer = await backoff.call(Flaky(4), failed=failures.append, recovered=recovered.append)
    assert answer == "ok"
    assert [f.attempt for f in failures] == [1, 2, 3, 4]
    assert [f.delay for f in failures] == [0.001, 0.002, 0.004, 0.004]  # doubled up to the cap
    assert all(str(f.error) == "no answer" for f in failures)
    assert recovered == [4]


async def test_a_plain_callable_that_returns_an_awaitable_is_awaited() -> None:
    flaky = Flaky(2)
    assert await Backoff(Down, initial=0.001, longest=0.001).call(lambda: flaky()) == "ok"
    assert flaky.tries == 3


async def test_no_report_of_a_recovery_without_a_failure() -> None:
    recovered: list[int] = []
    assert await Backoff(Down, initial=1, longest=1).call(Flaky(0), recovered=recovered.append) == "ok"
    assert recovered == []


async def test_other_errors_are_raised_at_once() -> None:
    flaky = Flaky(3, ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await Backoff(Down, initial=0.001, longest=0.001).call(flaky)
    assert flaky.tries == 1


async def test_past_the_bound_the_last_error_is_raised_as_it_is() -> None:
    failures: list[Failure] = []
    flaky = Flaky(10_000)
    began = time.monotonic()
    with pytest.raises(Down, match="no answer"):
        await Backoff(Down, initial=0.02, longest=0.05, bound=0.2).call(flaky, failed=failures.append)
    took = time.monotonic() - began
    assert 0.2 <= took < 2.0
    assert 3 <= flaky.tries <= 12
    assert all(f.elapsed + f.delay <= 0.2 + 1e-6 for f in failures)  # no wait past the bound


def test_waits_double_up_to_the_longest() -> None:
    backoff = Backoff(Down, initial=1.0, longest=8.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 8.0]


async def test_jittered_waits_stay_between_the_jitter_and_the_wait() -> None:
    failures: list[Failure] = []
    backoff = Backoff(Down, initial=0.001, longest=0.001, jitter=0.5)
    await backoff.call(Flaky(20), failed=failures.append)
    delays = {f.delay for f in failures}
    assert all(0.0005 <= d <= 0.001 for d in delays) and len(delays) > 1
