"""The scheduler shell: decide, record, evolve, project, deliver; recovery from the log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.event_store import InMemoryEventStore, TransientStoreError
from gpuquota.adapters.sqlite_store import SqliteEventStore
from gpuquota.core import fingerprint
from gpuquota.gateway.render import describe_job
from gpuquota.read.shares import share_table
from gpuquota.scheduler.loop import LoopFailed
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    CapacityLimit,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    Strategy,
)
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NodeCommand, RunAttempt, StopAttempt

G5 = "ml.g5.xlarge"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def setup(shell: SchedulerShell, nodes: int = 1) -> None:
    limits = (CapacityLimit(unit=G5, max_capacity=3),)
    share = QuotaShareSpec(
        name="QS1",
        job_queue="jq",
        capacity_limits=(CapacityLimit(unit=G5, max_capacity=1),),
        strategy=Strategy.LEND_AND_BORROW,
        in_share_preemption=True,
    )
    messages: list[SchedulerInput] = [
        shell.make(inp.CreateSchedulingPolicy, spec=SchedulingPolicySpec(name="p")),
        shell.make(
            inp.CreateServiceEnvironment, spec=ServiceEnvironmentSpec(name="se", capacity_limits=limits)
        ),
        shell.make(
            inp.CreateJobQueue, spec=JobQueueSpec(name="jq", service_environment="se", scheduling_policy="p")
        ),
        shell.make(inp.CreateQuotaShare, spec=share),
    ]
    for index in range(nodes):
        slots = tuple(SlotOffer(unit=G5) for _ in range(3))
        messages.append(shell.make(inp.RegisterNode, node_id=f"node-{index}", slots=slots))
    for message in messages:
        await shell.handle(message)


def job(job_id: str, priority: int = 0, created_at: int = 1) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        job_name=job_id,
        job_queue="jq",
        quota_share="QS1",
        unit=G5,
        priority=priority,
        created_at=created_at,
    )


async def submit(shell: SchedulerShell, job_id: str, priority: int = 0) -> list[ev.SchedulerEvent]:
    return await shell.handle(shell.make(inp.SubmitJob, job=job(job_id, priority, shell.clock())))


async def report(shell: SchedulerShell, job_id: str, status: str) -> None:
    record = shell.state.jobs[job_id]
    assert record.attempt_id is not None
    await shell.handle(
        shell.make(
            inp.AttemptReport,
            node_id=record.placements[0].node_id,
            job_id=job_id,
            attempt_id=record.attempt_id,
            status=status,
        )
    )


async def test_handle_records_evolves_and_projects() -> None:
    store = InMemoryEventStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)
    events = await submit(shell, "a")
    assert [type(e) for e in events] == [ev.JobAccepted, ev.JobDispatched]
    assert shell.state.jobs["a"].status == "SCHEDULED"
    assert shell.read_model.jobs["a"].status == "SCHEDULED"
    assert shell.seq == await store.last_seq("default") == 6
    (last,) = await store.read("default", after_seq=5)
    assert last.events == tuple(events)


async def test_duplicate_input_is_ignored() -> None:
    shell = SchedulerShell(InMemoryEventStore(), clock=Clock(), tick_seconds=0)
    await setup(shell)
    message = shell.make(inp.SubmitJob, job=job("a"))
    assert await shell.handle(message)
    before = fingerprint(shell.state)
    assert await shell.handle(message) == []
    assert fingerprint(shell.state) == before


async def test_rejections_are_recorded_and_returned() -> None:
    store = InMemoryEventStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    (event,) = await shell.handle(shell.make(inp.DeleteJobQueue, name="nope"))
    assert isinstance(event, ev.InputRejected) and event.reason == "Job queue nope does not exist"
    assert await store.last_seq("default") == 1


async def test_quiet_ticks_are_not_logged() -> None:
    store = InMemoryEventStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)
    seq = shell.seq
    assert await shell.handle(shell.make(inp.Tick)) == []
    assert await shell.handle(shell.make(inp.NodeHeartbeat, node_id="node-0")) == []
    assert await store.last_seq("default") == seq


async def test_node_commands_and_job_states_are_delivered_in_order() -> None:
    shell = SchedulerShell(InMemoryEventStore(), clock=Clock(), tick_seconds=0)
    delivered: list[NodeCommand] = []
    published: list[str] = []

    async def sink(command: NodeCommand) -> None:
        delivered.append(command)

    async def subscriber(event: ev.SchedulerEvent) -> None:
        job_id = event.job.job_id if isinstance(event, ev.JobAccepted) else getattr(event, "job_id", "")
        published.append(f"{event.type}:{job_id}")

    shell.node_command_sink = sink
    shell.subscribe(subscriber)
    await shell.start()
    try:
        await setup(shell)
        await submit(shell, "low", 1)
        await report(shell, "low", "RUNNING")
        await submit(shell, "b", 0)  # borrows
        await report(shell, "b", "RUNNING")
        await submit(shell, "c", 0)
        await report(shell, "c", "RUNNING")
        await submit(shell, "high", 5)  # in-share preemption of the lowest-priority job
        await shell.idle()
        kinds = [(type(c).__name__, c.job_id) for c in delivered if isinstance(c, RunAttempt | StopAttempt)]
        assert kinds[:3] == [("RunAttempt", "low"), ("RunAttempt", "b"), ("RunAttempt", "c")]
        assert isinstance(delivered[-1], StopAttempt) and isinstance(delivered[0], RunAttempt)
        assert published[:2] == ["JobAccepted:low", "JobDispatched:low"]
        assert "JobRunning:c" in published
    finally:
        await shell.stop()


async def test_a_failing_sink_does_not_stop_delivery() -> None:
    shell = SchedulerShell(InMemoryEventStore(), clock=Clock(), tick_seconds=0)
    seen: list[str] = []

    async def sink(command: NodeCommand) -> None:
        assert isinstance(command, RunAttempt | StopAttempt)
        seen.append(command.job_id)
        raise RuntimeError("node unreachable")

    shell.node_command_sink = sink
    await shell.start()
    try:
        await setup(shell)
        await submit(shell, "a")
        await submit(shell, "b")
        await shell.idle()
        assert seen == ["a", "b"]
    finally:
        await shell.stop()


async def test_tick_task_feeds_time() -> None:
    shell = SchedulerShell(InMemoryEventStore(), tick_seconds=0.01, heartbeat_timeout_ms=50)
    await setup(shell)
    await shell.start()
    try:
        # the pool's only node goes silent: ticks alone move time on, so the core sees every node of
        # the pool silent at once and suspends node loss (full disruption) instead of losing it
        await eventually(lambda: bool(shell.state.loss_suspended))
        assert shell.state.nodes["node-0"].online
    finally:
        await shell.stop()


async def _history(shell: SchedulerShell) -> None:
    await setup(shell)
    for job_id, priority in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        await submit(shell, job_id, priority)
    await report(shell, "a", "RUNNING")
    await report(shell, "a", "SUCCEEDED")
    await report(shell, "b", "RUNNING")
    await shell.handle(shell.make(inp.TerminateJob, job_id="c", reason="bye"))


async def test_recover_rebuilds_state_and_read_model(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.sqlite3")
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await _history(shell)
    expected_state = fingerprint(shell.state)
    expected_jobs = {j: describe_job(shell.read_model.arns, v) for j, v in shell.read_model.jobs.items()}
    expected_usage = share_table(shell.read_model)
    await store.close()

    store = await SqliteEventStore.open(tmp_path / "events.sqlite3")
    try:
        again = SchedulerShell(store, clock=Clock(), tick_seconds=0)
        assert await again.recover() == shell.seq
        assert again.seq == shell.seq
        assert fingerprint(again.state) == expected_state
        assert {
            j: describe_job(again.read_model.arns, v) for j, v in again.read_model.jobs.items()
        } == expected_jobs
        assert share_table(again.read_model) == expected_usage
        # and it goes on from there
        assert await submit(again, "e")
        assert again.seq == shell.seq + 1
    finally:
        await store.close()


async def test_concurrent_inputs_are_serialised() -> None:
    shell = SchedulerShell(InMemoryEventStore(), clock=Clock(), tick_seconds=0)
    await setup(shell, nodes=0)
    submissions: list[Awaitable[list[ev.SchedulerEvent]]] = [submit(shell, f"j{i}") for i in range(50)]
    await asyncio.gather(*submissions)
    assert shell.seq == 4 + 50
    assert len(shell.read_model.runnable[("jq", "QS1")]) == 50


# ----- group commit ----------------------------------------------------------------------------------


class CountingStore(InMemoryEventStore):
    """Counts batches; ``fail_next`` makes the next ``append_many`` (and ``append`` of one id) fail."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.fail_next: Exception | None = None
        self.fail_id: str | None = None

    async def append_many(self, pool: str, expected_seq: int, entries: Any) -> int:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if any(message.event_id == self.fail_id for message, _, _ in entries):
            raise TransientStoreError("database unreachable")
        self.batches.append(len(entries))
        return await super().append_many(pool, expected_seq, entries)

    async def append(
        self, pool: str, expected_seq: int, message: Any, events: Any, position: Any = None
    ) -> int:
        if message.event_id == self.fail_id:
            raise TransientStoreError("database unreachable")
        return await super().append(pool, expected_seq, message, events, position)


async def rebuilt(store: InMemoryEventStore) -> Any:
    """The fingerprint of the state folded from the log."""
    again = SchedulerShell(store, tick_seconds=0)
    await again.recover()
    return fingerprint(again.state)


async def test_concurrent_inputs_share_commits_and_decide_as_in_sequence() -> None:
    store = CountingStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)
    messages = [shell.make(inp.SubmitJob, job=job(f"j{i}", i % 4, i)) for i in range(40)]
    results = await asyncio.gather(*(shell.handle(m) for m in messages))
    assert len(store.batches) < 10 and sum(store.batches) == 5 + 40
    assert [r.input.event_id for r in await store.read("default", after_seq=5)] == [
        m.event_id for m in messages
    ]

    one_by_one = SchedulerShell(InMemoryEventStore(), clock=Clock(), tick_seconds=0, group_commit=False)
    await setup(one_by_one)
    expected = [await one_by_one.handle(m) for m in messages]
    assert [[type(e) for e in r] for r in results] == [[type(e) for e in r] for r in expected]
    assert fingerprint(shell.state) == fingerprint(one_by_one.state) == await rebuilt(store)
    assert share_table(shell.read_model) == share_table(one_by_one.read_model)


async def test_a_failed_batch_is_redone_one_input_at_a_time() -> None:
    store = CountingStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0, store_retry_seconds=0.2)
    await setup(shell)
    first = shell.make(inp.SubmitJob, job=job("a"))
    assert await shell.handle(first)

    # a duplicate in a batch: the batch fails, the others are recorded, the duplicate answers []
    again = [first, shell.make(inp.SubmitJob, job=job("b")), shell.make(inp.SubmitJob, job=job("c"))]
    results = await asyncio.gather(*(shell.handle(m) for m in again))
    assert results[0] == [] and results[1] and results[2]
    assert fingerprint(shell.state) == await rebuilt(store)

    # a store error once: the append is retried (the loop's retry policy) and records the batch
    store.fail_next = TransientStoreError("database unreachable")
    both = [shell.make(inp.SubmitJob, job=job("f")), shell.make(inp.SubmitJob, job=job("g"))]
    assert all(await asyncio.gather(*(shell.handle(m) for m in both)))
    assert not shell.failure and {"f", "g"} <= set(shell.state.jobs)

    # an input the store refuses past the bounded retries: it fails alone, the state follows the log,
    # and the shell fails (fail fast, to be restarted): it refuses every later input
    lost, kept = shell.make(inp.SubmitJob, job=job("d")), shell.make(inp.SubmitJob, job=job("e"))
    store.fail_id = lost.event_id
    outcomes = await asyncio.gather(shell.handle(lost), shell.handle(kept), return_exceptions=True)
    assert isinstance(outcomes[0], LoopFailed) and isinstance(outcomes[1], list)
    assert "d" not in shell.state.jobs and "e" in shell.state.jobs and "d" not in shell.read_model.jobs
    assert fingerprint(shell.state) == await rebuilt(store)
    assert shell.seq == await store.last_seq("default")
    assert isinstance(await shell.wait(), LoopFailed)
    with pytest.raises(LoopFailed):
        await shell.handle(shell.make(inp.SubmitJob, job=job("h")))


async def test_an_input_that_fails_in_the_core_fails_alone(monkeypatch: Any) -> None:
    """The batch steps inputs on the live state: one that raises half-way (here: after its events were
    applied) is answered with the error and leaves no trace; the rest of its batch is decided as usual."""
    import gpuquota.scheduler.loop as loop_module  # the step of every batch

    store = CountingStore()
    shell = SchedulerShell(store, clock=Clock(), tick_seconds=0)
    await setup(shell)
    bad = shell.make(inp.SubmitJob, job=job("bad"))
    from gpuquota.core import step as real_step

    def failing_step(state: Any, message: SchedulerInput, before: Any = None) -> list[ev.SchedulerEvent]:
        events = real_step(state, message, before)
        if message.event_id == bad.event_id:
            raise RuntimeError("a bug in the core")
        return events

    monkeypatch.setattr(loop_module, "step", failing_step)
    messages = [shell.make(inp.SubmitJob, job=job("a")), bad, shell.make(inp.SubmitJob, job=job("b"))]
    outcomes = await asyncio.gather(*(shell.handle(m) for m in messages), return_exceptions=True)
    assert isinstance(outcomes[1], RuntimeError)
    assert isinstance(outcomes[0], list) and outcomes[0] and isinstance(outcomes[2], list) and outcomes[2]
    assert store.batches[-1] == 2  # one batch, without the failed input
    assert "bad" not in shell.state.jobs and "bad" not in shell.read_model.jobs
    assert "a" in shell.state.jobs and "b" in shell.state.jobs
    assert fingerprint(shell.state) == await rebuilt(store)
