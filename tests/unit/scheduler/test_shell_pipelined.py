"""The shell's second batch in flight: decided while the first is written, answered after it.

``GatedStore`` holds every ``append_many`` until the test opens its gate, so two batches are in flight
for certain (the second decided on the state the first left, its append naming the sequence the first
ends at)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gpuquota.adapters.event_store import (
    EventStoreError,
    InMemoryEventStore,
    Record,
    TransientStoreError,
)
from gpuquota.core import fingerprint
from gpuquota.scheduler.loop import LoopFailed
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from tests.unit.scheduler.test_shell import Clock, eventually, job, rebuilt, setup

SETUP_RECORDS = 5  # setup(shell): policy, environment, queue, share, one node


class GatedStore(InMemoryEventStore):
    """Appends wait for ``gate``; ``fail_first`` fails the next append once the gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.calls: list[tuple[int, int]] = []
        """(expected_seq, entries) of every ``append_many``, in call order."""
        self.outcomes: list[str] = []
        self.fail_first: Exception | None = None

    async def append_many(self, pool: str, expected_seq: int, entries: Any) -> int:
        self.calls.append((expected_seq, len(entries)))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_first is not None:
            error, self.fail_first = self.fail_first, None
            self.outcomes.append(type(error).__name__)
            raise error
        try:
            seq = await super().append_many(pool, expected_seq, entries)
        except Exception as exc:
            self.outcomes.append(type(exc).__name__)
            raise
        self.outcomes.append("ok")
        return seq


def accepted(records: list[Record]) -> list[str]:
    """The job ids the records accepted, in log order."""
    return [e.job.job_id for r in records for e in r.events if isinstance(e, ev.JobAccepted)]


def answered_as(answered: list[str], name: str) -> Callable[[object], None]:
    """A done callback that notes ``name`` as answered."""
    return lambda _: answered.append(name)


def calls_reach(store: GatedStore, count: int) -> Callable[[], bool]:
    return lambda: len(store.calls) == count


async def two_batches_in_flight(
    shell: SchedulerShell, store: GatedStore
) -> tuple[list[asyncio.Task[list[ev.SchedulerEvent]]], list[str]]:
    """Submit a0..a2 (the first batch, held at the gate), then b0..b2 (the second); the tasks in
    submission order and the job ids in the order they were answered."""
    store.calls.clear()
    store.outcomes.clear()
    store.gate = asyncio.Event()
    answered: list[str] = []
    tasks = []
    for names in (["a0", "a1", "a2"], ["b0", "b1", "b2"]):
        for name in names:
            task = asyncio.create_task(shell.handle(shell.make(inp.SubmitJob, job=job(name))))
            task.add_done_callback(answered_as(answered, name))
            tasks.append(task)
        await eventually(calls_reach(store, len(store.calls) + 1))
    return tasks, answered


async def test_the_second_batch_is_decided_while_the_first_is_written_and_answered_after_it() -> None:
    store = GatedStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)
    tasks, answered = await two_batches_in_flight(shell, store)
    # the second append names the sequence the first ends at; nothing is answered before a commit
    assert store.calls == [(SETUP_RECORDS, 3), (SETUP_RECORDS + 3, 3)]
    assert not any(task.done() for task in tasks) and "b0" not in shell.read_model.jobs

    assert store.gate is not None
    store.gate.set()
    results = await asyncio.gather(*tasks)
    assert answered == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert all(results) and store.outcomes == ["ok", "ok"]
    logged = await store.read("default", after_seq=SETUP_RECORDS)
    assert accepted(logged) == answered
    assert fingerprint(shell.state) == await rebuilt(store)
    assert shell.seq == await store.last_seq("default")


async def test_a_failed_first_append_fails_the_second_and_both_are_redone_one_at_a_time() -> None:
    store = GatedStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)
    store.fail_first = EventStoreError("disk I/O error")
    tasks, answered = await two_batches_in_flight(shell, store)
    assert store.gate is not None
    store.gate.set()
    results = await asyncio.gather(*tasks)

    # the first failed, so the second (expected sequence 8, log at 5) was refused as a stale writer;
    # then every input was recorded on its own, in order, and answered in that order
    assert store.outcomes[:2] == ["EventStoreError", "StaleWriter"]
    assert store.outcomes[2:] == ["ok"] * 6 and [n for _, n in store.calls[2:]] == [1] * 6
    assert all(results) and answered == ["a0", "a1", "a2", "b0", "b1", "b2"]
    logged = await store.read("default", after_seq=SETUP_RECORDS)
    assert accepted(logged) == answered
    assert not shell.failure
    assert fingerprint(shell.state) == await rebuilt(store)
    assert set(shell.read_model.jobs) >= set(answered)


async def test_a_first_append_past_its_retries_fails_the_shell_and_the_second_batch() -> None:
    """Fail fast: the first batch's append stays unavailable past ``store_retry_seconds``: its inputs
    are redone on their own (the store is back for them here), the second batch, never recorded, is
    answered with the failure, and the shell refuses every later input."""
    store = GatedStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0, store_retry_seconds=0.0)
    await setup(shell)
    store.fail_first = TransientStoreError("database unreachable")
    tasks, _ = await two_batches_in_flight(shell, store)
    assert store.gate is not None
    store.gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)

    assert all(isinstance(outcome, list) and outcome for outcome in outcomes[:3])
    assert all(isinstance(outcome, LoopFailed) for outcome in outcomes[3:])
    assert isinstance(await shell.wait(), LoopFailed)
    assert {"a0", "a1", "a2"} <= set(shell.state.jobs) and not {"b0", "b1", "b2"} & set(shell.state.jobs)
    assert "b0" not in shell.read_model.jobs
    assert fingerprint(shell.state) == await rebuilt(store)
    assert shell.seq == await store.last_seq("default")


async def test_an_input_that_fails_in_the_core_beside_a_batch_in_flight_fails_alone(
    monkeypatch: Any,
) -> None:
    """The batch before settles first (its answers stay first), then the state is folded again."""
    import gpuquota.scheduler.loop as loop_module  # the step of every batch
    from gpuquota.core import step as real_step

    store = GatedStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)

    raised: list[str] = []

    def failing_step(state: Any, message: Any, before: Any = None) -> list[ev.SchedulerEvent]:
        events = real_step(state, message, before)
        if isinstance(message, inp.SubmitJob) and message.job.job_id == "b1":
            raised.append(message.job.job_id)
            raise RuntimeError("a bug in the core")
        return events

    monkeypatch.setattr(loop_module, "step", failing_step)
    store.calls.clear()
    store.gate = asyncio.Event()
    answered: list[str] = []
    first = [asyncio.create_task(shell.handle(shell.make(inp.SubmitJob, job=job(f"a{i}")))) for i in range(2)]
    for index, task in enumerate(first):
        task.add_done_callback(answered_as(answered, f"a{index}"))
    await eventually(lambda: len(store.calls) == 1)
    second = [
        asyncio.create_task(shell.handle(shell.make(inp.SubmitJob, job=job(f"b{i}")))) for i in range(3)
    ]
    for index, task in enumerate(second):
        task.add_done_callback(answered_as(answered, f"b{index}"))
    await eventually(lambda: raised == ["b1"])  # b1 fails in the core while a0, a1 are written
    assert not any(task.done() for task in first + second)
    store.gate.set()
    outcomes = await asyncio.gather(*first, *second, return_exceptions=True)

    assert isinstance(outcomes[3], RuntimeError)
    assert all(isinstance(outcome, list) and outcome for i, outcome in enumerate(outcomes) if i != 3)
    assert answered == ["a0", "a1", "b1", "b0", "b2"]
    assert "b1" not in shell.state.jobs and "b1" not in shell.read_model.jobs
    assert fingerprint(shell.state) == await rebuilt(store)
