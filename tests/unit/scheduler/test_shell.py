"""The scheduler shell: decide, record, evolve, project, deliver; recovery from the log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuquota.adapters.event_store import InMemoryEventStore
from gpuquota.adapters.sqlite_store import SqliteEventStore
from gpuquota.core import fingerprint
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
        kinds = [(type(c).__name__, c.job_id) for c in delivered]
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
        await eventually(lambda: not shell.state.nodes["node-0"].online)
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
    expected_jobs = {j: shell.read_model.describe_job(v) for j, v in shell.read_model.jobs.items()}
    expected_usage = shell.read_model.share_table()
    await store.close()

    store = await SqliteEventStore.open(tmp_path / "events.sqlite3")
    try:
        again = SchedulerShell(store, clock=Clock(), tick_seconds=0)
        assert await again.recover() == shell.seq
        assert again.seq == shell.seq
        assert fingerprint(again.state) == expected_state
        assert {
            j: again.read_model.describe_job(v) for j, v in again.read_model.jobs.items()
        } == expected_jobs
        assert again.read_model.share_table() == expected_usage
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
