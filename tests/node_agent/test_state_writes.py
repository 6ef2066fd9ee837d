"""When the node agent writes ``state.json`` and how it sends: a record is on disk before its attempt
launches and a final report before it is sent, launches of one moment share a write, and reports sent in
batches (``send_many``) arrive in order, none lost, also when a send fails."""

from __future__ import annotations

import json
from pathlib import Path

from gpuquota.adapters.event_store import InMemoryEventStore
from gpuquota.entrypoints.embedded import handle_in_order
from gpuquota.node_agent import AttemptHandle, LaunchSpec, SimulatedRuntime
from gpuquota.node_agent.sending import head_batch
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import AttemptReport, AttemptStatus, RegisterNode, SchedulerInput
from tests.node_agent.conftest import AgentFactory, Scheduler, run_cmd, wait_final, wait_until
from tests.node_agent.test_simulated_and_restart import sim_payload

WAVE = 8


class CheckingRuntime(SimulatedRuntime):
    """Simulated attempts that note, at each launch, whether ``state.json`` already holds the attempt."""

    def __init__(self, state_path: Path) -> None:
        super().__init__()
        self.state_path = state_path
        self.recorded_at_launch: dict[str, bool] = {}

    async def launch(self, spec: LaunchSpec) -> AttemptHandle:
        attempts = json.loads(self.state_path.read_text())["attempts"]
        self.recorded_at_launch[spec.attempt_id] = spec.attempt_id in attempts
        return await super().launch(spec)


class CheckingScheduler(Scheduler):
    """Notes, for each final report it receives, whether ``state.json`` holds that outcome already."""

    def __init__(self, state_path: Path) -> None:
        super().__init__()
        self.state_path = state_path
        self.final_on_disk: dict[str, bool] = {}

    async def send(self, message: SchedulerInput) -> None:
        if isinstance(message, AttemptReport) and message.status in ("SUCCEEDED", "FAILED", "STOPPED"):
            record = json.loads(self.state_path.read_text())["attempts"].get(message.attempt_id) or {}
            self.final_on_disk[message.attempt_id] = (record.get("final") or {}).get(
                "status"
            ) == message.status
        await super().send(message)

    async def send_many(self, messages: list[SchedulerInput]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        for message in messages:
            try:
                await self.send(message)
            except ConnectionError as exc:
                results.append(exc)
            else:
                results.append(None)
        return results


async def test_a_wave_of_launches_shares_one_write_and_each_record_precedes_its_launch(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    runtime = CheckingRuntime(work / "state.json")
    sched = Scheduler()
    agent = make_agent(sched, runtime=runtime, slots=f"ml.g5.xlarge={WAVE}", work_dir=work)
    await agent.start()
    await agent.flush(5)
    writes_before = agent._saver.writes
    for i in range(WAVE):  # delivered in one go, as the shell delivers a batch's commands
        await agent.deliver(run_cmd(sim_payload(600), job_id=f"job-{i}", slots=(i,)))
    await wait_until(lambda: len(runtime.recorded_at_launch) == WAVE, what="every launch")
    assert all(runtime.recorded_at_launch.values()), runtime.recorded_at_launch
    assert agent._saver.writes - writes_before < WAVE, "launches of one moment share their write"


async def test_every_final_report_is_on_disk_before_it_is_sent(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    for batched in (False, True):
        sched = CheckingScheduler(work / "state.json")
        agent = make_agent(
            sched,
            runtime=SimulatedRuntime(),
            slots=f"ml.g5.xlarge={WAVE}",
            work_dir=work,
            send_many=sched.send_many if batched else None,
        )
        await agent.start()
        for i in range(WAVE):
            await agent.deliver(run_cmd(sim_payload(0.01 * (i % 3)), job_id=f"job-{batched}-{i}", slots=(i,)))
        for i in range(WAVE):
            await wait_final(sched, f"job-{batched}-{i}-a1")
        assert len(sched.final_on_disk) == WAVE and all(sched.final_on_disk.values()), sched.final_on_disk
        await agent.stop()


async def test_batched_sends_keep_each_attempts_reports_in_order_and_lose_none(
    make_agent: AgentFactory,
) -> None:
    sched = CheckingScheduler(Path("/nonexistent"))
    sched.final_on_disk = {}
    agent = make_agent(
        sched, runtime=SimulatedRuntime(), slots=f"ml.g5.xlarge={WAVE}", send_many=sched.send_many
    )
    sched.state_path = agent.state_path
    await agent.start()
    await agent.flush(5)
    for i in range(WAVE):
        await agent.deliver(run_cmd(sim_payload(0.01 * (i % 4)), job_id=f"job-{i}", slots=(i,)))
    sched.fail_next = 3  # the link fails in the middle of batches: those reports are sent again
    for i in range(WAVE):
        await wait_final(sched, f"job-{i}-a1")
    assert sched.attempted > len(sched.inputs), "some sends failed and were retried"
    delivered = {m.event_id: m for m in sched.inputs}  # a repeated input is skipped by its event id
    for i in range(WAVE):
        statuses = [
            m.status for m in delivered.values() if isinstance(m, AttemptReport) and m.job_id == f"job-{i}"
        ]
        assert statuses == ["STARTING", "RUNNING", "SUCCEEDED"], (i, statuses)


def test_a_batch_holds_one_report_per_attempt_and_node_inputs_alone() -> None:
    def report(attempt: str, status: AttemptStatus) -> AttemptReport:
        return AttemptReport(
            event_id=f"{attempt}-{status}",
            occurred_at=1,
            node_id="n",
            job_id=attempt,
            attempt_id=attempt,
            status=status,
        )

    register = RegisterNode(event_id="r", occurred_at=1, node_id="n", pool="default", slots=())
    a1, b1, a2 = report("a", "STARTING"), report("b", "STARTING"), report("a", "RUNNING")
    assert head_batch([a1, b1, a2]) == [a1, b1]
    assert head_batch([a1, register, b1]) == [a1]
    assert head_batch([register, a1]) == [register]
    assert head_batch([a1, b1], limit=1) == [a1]


async def test_the_embedded_shell_records_a_batch_of_reports_in_order() -> None:
    store = InMemoryEventStore()
    shell = SchedulerShell(store, tick_seconds=0)
    slots = (SlotOffer(unit="ml.g5.xlarge"),)
    messages: list[SchedulerInput] = [
        shell.make(inp.RegisterNode, node_id=f"node-{i}", slots=slots) for i in range(20)
    ]
    assert await handle_in_order(shell, messages) == [None] * len(messages)
    records = await store.read(shell.pool)
    assert [r.input.event_id for r in records] == [m.event_id for m in messages]


async def test_a_forgotten_attempt_is_noted_finished_by_the_write_that_drops_it(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    """``finished-attempts`` is appended with the ``state.json`` write that no longer holds the attempt
    (off the loop, not at once); a restarted agent then ignores the attempt's repeated ``RunAttempt``."""
    work = tmp_path / "work"
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime(), work_dir=work)
    await agent.start()
    await agent.deliver(run_cmd(sim_payload(0), job_id="done"))
    await wait_final(sched, "done-a1")
    await agent.flush(5)

    def noted_and_dropped() -> bool:
        attempts = json.loads((work / "state.json").read_text())["attempts"]
        finished = work / "finished-attempts"
        return "done-a1" not in attempts and finished.exists() and "done-a1" in finished.read_text().split()

    await wait_until(noted_and_dropped, what="the attempt in finished-attempts, not in state.json")
    await agent.stop()
    again = make_agent(sched, runtime=SimulatedRuntime(), work_dir=work)
    await again.start()
    await again.deliver(run_cmd(sim_payload(0), job_id="done"))  # repeated after the restart: ignored
    await again.flush(5)
    assert sched.statuses("done-a1") == ["STARTING", "RUNNING", "SUCCEEDED"]
