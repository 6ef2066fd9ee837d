"""The simulated runtime, and an agent restarting on the same node (adoption, loss, fencing)."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.node_agent import ProcessRuntime, SimulatedRuntime, procs
from gpuquota.wire.inputs import RegisterNode
from tests.node_agent.conftest import (
    AgentFactory,
    Scheduler,
    python_payload,
    run_cmd,
    stop_cmd,
    wait_final,
    wait_until,
)


def sim_payload(duration: float, exit_code: int = 0) -> str:
    return json.dumps(
        {
            "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
            "Environment": {
                "GPUQUOTA_SIM_DURATION_SECONDS": str(duration),
                "GPUQUOTA_SIM_EXIT_CODE": str(exit_code),
            },
        }
    )


async def test_simulated_success_failure_and_stop(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime())
    await agent.start()
    await agent.deliver(run_cmd(sim_payload(0.05), job_id="ok"))
    await agent.deliver(run_cmd(sim_payload(0.05, 5), job_id="bad"))
    await agent.deliver(run_cmd(sim_payload(3600), job_id="long"))
    assert (await wait_final(sched, "ok-a1")).status == "SUCCEEDED"
    bad = await wait_final(sched, "bad-a1")
    assert (bad.status, bad.exit_code) == ("FAILED", 5)
    assert bad.status_reason == algorithm_error("exited with code 5")
    await wait_until(lambda: "RUNNING" in sched.statuses("long-a1"), what="RUNNING")
    await agent.deliver(stop_cmd("long", "long-a1"))
    stopped = await wait_final(sched, "long-a1", timeout=2)
    assert stopped.status == "STOPPED"
    assert sched.statuses("long-a1") == ["STARTING", "RUNNING", "STOPPED"]


async def test_simulated_defaults_and_bad_settings(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime())
    await agent.start()
    await agent.deliver(run_cmd("", job_id="default"))  # empty payload: 60 s, exit 0
    await wait_until(lambda: "RUNNING" in sched.statuses("default-a1"), what="RUNNING")
    bad = json.dumps({"Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": "soon"}})
    await agent.deliver(run_cmd(bad, job_id="bad"))
    report = await wait_final(sched, "bad-a1")
    assert report.status == "FAILED" and "Invalid simulation settings" in (report.status_reason or "")
    assert sched.final("default-a1") is None


SLEEPER = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    def bye(*_):
        pathlib.Path(os.environ["OUT_DIR"], "terminated").write_text("yes")
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye)
    pathlib.Path(os.environ["OUT_DIR"], "pid").write_text(str(os.getpid()))
    while not pathlib.Path(os.environ["OUT_DIR"], "finish").exists():
        time.sleep(0.02)
    """
)


async def _start_then_abandon(
    make_agent: AgentFactory, out: Path, wrapper: tuple[str, ...]
) -> tuple[int, Path]:
    """Agent 1 starts a long job through ``wrapper``, then goes away without stopping it."""
    sched1 = Scheduler()
    agent1 = make_agent(sched1, exit_wrapper=wrapper)
    await agent1.start()
    await agent1.deliver(run_cmd(python_payload(SLEEPER, Environment={"OUT_DIR": str(out)})))
    pid_file = out / "pid"
    await wait_until(lambda: pid_file.exists() and pid_file.read_text(), what="the job to write its pid")
    await wait_until(lambda: "RUNNING" in sched1.statuses("job-1-a1"), what="RUNNING")
    await agent1.stop()
    pid = int((out / "pid").read_text())
    assert procs.pid_alive(pid), "stopping the agent must leave the job running"
    record = json.loads(agent1.state_path.read_text())["attempts"]["job-1-a1"]
    # the recorded process is the exit wrapper, which leads the job's process group
    assert record["pid"] == record["pgid"] == os.getpgid(pid)
    return record["pgid"], agent1.work_dir


async def test_restart_adopts_and_fencing_stops_the_orphan(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pid, work_dir = await _start_then_abandon(make_agent, out, exit_wrapper)

    sched2 = Scheduler()
    agent2 = make_agent(sched2, work_dir=work_dir, exit_wrapper=exit_wrapper)
    await agent2.start()
    # the RegisterNode lists the adopted attempt as running ...
    await agent2.flush(5)
    registration = sched2.inputs[0]
    assert isinstance(registration, RegisterNode)
    assert [(a.attempt_id, a.status) for a in registration.attempts or ()] == [("job-1-a1", "RUNNING")]
    assert agent2.active_attempts == ["job-1-a1"]
    # ... and a scheduler that no longer assigns it answers with StopAttempt (AttemptFenced)
    await agent2.deliver(
        stop_cmd("job-1", "job-1-a1", "The scheduler does not assign this attempt to the node")
    )
    report = await wait_final(sched2, "job-1-a1")
    assert report.status == "STOPPED"
    assert (out / "terminated").exists()
    assert not procs.group_alive(pid)
    await agent2.flush(5)
    assert json.loads(agent2.state_path.read_text())["attempts"] == {}


async def test_restart_adopted_attempt_ending_alone_is_reported_by_its_exit_code(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _, work_dir = await _start_then_abandon(make_agent, out, exit_wrapper)
    sched2 = Scheduler()
    agent2 = make_agent(sched2, work_dir=work_dir, exit_wrapper=exit_wrapper)
    await agent2.start()
    assert agent2.active_attempts == ["job-1-a1"]
    (out / "finish").write_text("now")
    report = await wait_final(sched2, "job-1-a1")
    assert (report.status, report.exit_code) == ("SUCCEEDED", 0)
    await agent2.flush(5)
    assert json.loads(agent2.state_path.read_text())["attempts"] == {}


async def test_an_attempt_that_ended_while_no_agent_ran_is_reported_by_its_exit_code(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pgid, work_dir = await _start_then_abandon(make_agent, out, exit_wrapper)
    (out / "finish").write_text("now")
    await wait_until(lambda: not procs.group_alive(pgid), what="the job to end")
    sched2 = Scheduler()
    agent2 = make_agent(sched2, work_dir=work_dir, exit_wrapper=exit_wrapper)
    await agent2.start()
    report = await wait_final(sched2, "job-1-a1")
    assert (report.status, report.exit_code) == ("SUCCEEDED", 0)
    registration = sched2.inputs[0]
    assert isinstance(registration, RegisterNode)
    assert [a.attempt_id for a in registration.attempts or ()] == ["job-1-a1"]


async def test_a_final_report_not_delivered_is_sent_again_after_a_restart(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    sched1 = Scheduler()
    agent1 = make_agent(sched1, runtime=SimulatedRuntime())
    await agent1.start()
    await agent1.flush(5)
    sched1.fail_next = 1_000  # the link is down: the final report stays in the outbox
    await agent1.deliver(run_cmd(sim_payload(0.01)))
    await wait_until(lambda: agent1.active_attempts == [], what="the attempt to end")
    await agent1.stop(flush_timeout=0.1)
    assert json.loads(agent1.state_path.read_text())["attempts"]["job-1-a1"]["final"]["status"] == "SUCCEEDED"
    sched2 = Scheduler()
    agent2 = make_agent(sched2, runtime=SimulatedRuntime(), work_dir=agent1.work_dir)
    await agent2.start()
    assert (await wait_final(sched2, "job-1-a1")).status == "SUCCEEDED"
    registration = sched2.inputs[0]
    assert isinstance(registration, RegisterNode)
    assert [(a.attempt_id, a.status) for a in registration.attempts or ()] == [("job-1-a1", "SUCCEEDED")]
    await agent2.flush(5)
    assert json.loads(agent2.state_path.read_text())["attempts"] == {}
    # delivered again (a scheduler republishing), it does not run twice
    await agent2.deliver(run_cmd(sim_payload(0.01)))
    await agent2.flush(5)
    assert sched2.statuses("job-1-a1") == ["SUCCEEDED"]
    await agent2.stop()


async def test_restart_with_the_process_gone_forgets_it_unreported(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pgid, work_dir = await _start_then_abandon(make_agent, out, exit_wrapper)
    os.killpg(pgid, signal.SIGKILL)  # no exit file: nothing says how it ended
    await wait_until(lambda: not procs.group_alive(pgid), what="the job to die")
    sched2 = Scheduler()
    agent2 = make_agent(sched2, work_dir=work_dir, exit_wrapper=exit_wrapper)
    await agent2.start()
    await agent2.flush(5)
    # not listed in the registration: the scheduler requeues it as lost (no retry counted)
    registration = sched2.inputs[0]
    assert isinstance(registration, RegisterNode) and registration.attempts == ()
    assert sched2.statuses("job-1-a1") == []
    assert agent2.active_attempts == []


async def test_restart_with_a_reused_pid_does_not_adopt(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    from gpuquota.node_agent.launch import AdoptRecord

    me = os.getpid()
    wrong_start = (procs.start_time(me) or 0) + 12345
    assert runtime.adopt(AdoptRecord("process", me, me, wrong_start)) is None
    assert runtime.adopt(AdoptRecord("simulated", me, me, None)) is None
    assert SimulatedRuntime().adopt(AdoptRecord("simulated", None, None, None)) is None
