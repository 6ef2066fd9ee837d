"""Multi-instance attempts in the ``process`` runtime: one process per instance, the same host list,
own ranks, and the first failing instance fails the attempt and stops the others."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.node_agent import procs
from gpuquota.wire.node_commands import GangNode
from tests.node_agent.conftest import (
    NODE,
    AgentFactory,
    Scheduler,
    python_payload,
    run_cmd,
    stop_cmd,
    wait_final,
    wait_until,
)

INSTANCE = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    out = pathlib.Path(os.environ["OUT_DIR"])
    keys = ("SM_HOSTS", "SM_CURRENT_HOST", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")
    me = os.environ["SM_CURRENT_HOST"]
    # written aside, then renamed: a test that sees the file sees all of it
    (out / f".{me}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}))
    (out / f".{me}.json").rename(out / f"{me}.json")
    if os.environ.get("FAIL_HOST") == me:
        # fail only once every instance has started (and written its file), with a deadline
        hosts, deadline = json.loads(os.environ["SM_HOSTS"]), time.monotonic() + 30
        while not all((out / f"{h}.json").exists() for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(7)
    time.sleep(float(os.environ.get("SLEEP", "0")))
    """
)


def two_instances(out: Path, **env: str) -> str:
    resources = {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2}
    return python_payload(INSTANCE, Environment={"OUT_DIR": str(out), **env}, ResourceConfig=resources)


async def test_two_processes_share_the_host_list_and_have_their_own_ranks(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(two_instances(tmp_path), job_id="multi", slots=(0, 1)))
    report = await wait_final(sched, "multi-a1", 30)
    assert report.status == "SUCCEEDED", report.status_reason
    seen = [json.loads((tmp_path / f"{host}.json").read_text()) for host in ("algo-1", "algo-2")]
    assert {s["SM_HOSTS"] for s in seen} == {'["algo-1", "algo-2"]'}
    assert [(s["SM_CURRENT_HOST"], s["NODE_RANK"]) for s in seen] == [("algo-1", "0"), ("algo-2", "1")]
    assert {(s["WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {("2", "localhost")}
    assert len({s["MASTER_PORT"] for s in seen}) == 1 and seen[0]["pid"] != seen[1]["pid"]


async def test_one_failing_process_fails_the_attempt_and_stops_the_other(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    payload = two_instances(tmp_path, FAIL_HOST="algo-2", SLEEP="600")
    await agent.deliver(run_cmd(payload, job_id="multi", slots=(0, 1)))
    report = await wait_final(sched, "multi-a1", 60)
    assert (report.status, report.exit_code) == ("FAILED", 7)
    assert report.status_reason == algorithm_error("Instance algo-2 (rank 1) failed: exited with code 7")
    survivor = json.loads((tmp_path / "algo-1.json").read_text())["pid"]
    await wait_until(lambda: not procs.pid_alive(survivor), 5, "the other instance to be gone")


async def test_a_restarted_agent_adopts_every_instance(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    sched = Scheduler()
    work = tmp_path / "work"
    agent = make_agent(sched, work_dir=work, exit_wrapper=exit_wrapper)
    await agent.start()
    await agent.deliver(run_cmd(two_instances(tmp_path, SLEEP="600"), job_id="multi", slots=(0, 1)))
    files = [tmp_path / f"{host}.json" for host in ("algo-1", "algo-2")]
    await wait_until(lambda: all(f.exists() for f in files), 30, "both instances to start")
    await agent.stop()
    pids = [json.loads(f.read_text())["pid"] for f in files]
    record = json.loads((work / "state.json").read_text())["attempts"]["multi-a1"]
    # each instance runs under its exit wrapper, which leads the instance's process group
    assert [m[0] for m in record["members"]] == [os.getpgid(p) for p in pids]

    sched2 = Scheduler()
    agent2 = make_agent(sched2, work_dir=work, exit_wrapper=exit_wrapper)
    await agent2.start()
    await wait_until(lambda: "multi-a1" in agent2.active_attempts, 30, "adoption")
    await agent2.deliver(stop_cmd("multi", "multi-a1", "fenced"))
    assert (await wait_final(sched2, "multi-a1", 30)).status == "STOPPED"
    assert not any(procs.pid_alive(p) for p in pids), "both instances stopped"


async def test_a_restarted_agent_adopts_the_instances_of_its_part_of_a_gang(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    """This node runs ranks 1 and 2 of a 3-instance attempt (rank 0 is on another node): after a restart
    (the processes outlive the agent, as after kill -9) it adopts both under their own host names."""
    gang = (
        GangNode(node_id="elsewhere", instances=1, first_rank=0, address="10.0.0.1"),
        GangNode(node_id=NODE, instances=2, first_rank=1, address="127.0.0.1"),
    )
    work = tmp_path / "work"
    agent = make_agent(Scheduler(), work_dir=work)
    await agent.start()
    resources = {"InstanceType": "ml.g5.xlarge", "InstanceCount": 3}
    payload = python_payload(
        INSTANCE, Environment={"OUT_DIR": str(tmp_path), "SLEEP": "600"}, ResourceConfig=resources
    )
    cmd = run_cmd(payload, job_id="gang", slots=(0, 1))
    await agent.deliver(cmd.model_copy(update={"gang": gang}))
    files = [tmp_path / f"{host}.json" for host in ("algo-2", "algo-3")]
    await wait_until(lambda: all(f.exists() for f in files), 30, "both instances to start")
    seen = [json.loads(f.read_text()) for f in files]
    assert [(s["SM_CURRENT_HOST"], s["NODE_RANK"]) for s in seen] == [("algo-2", "1"), ("algo-3", "2")]
    assert {(s["SM_HOSTS"], s["WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {
        ('["algo-1", "algo-2", "algo-3"]', "3", "10.0.0.1")
    }
    await agent.stop()

    sched = Scheduler()
    restarted = make_agent(sched, work_dir=work)
    await restarted.start()
    await wait_until(lambda: "gang-a1" in restarted.active_attempts, 30, "adoption")
    os.kill(seen[1]["pid"], signal.SIGKILL)  # algo-3 dies: the part fails under its own name
    report = await wait_final(sched, "gang-a1", 30)
    assert report.status_reason == algorithm_error(
        "Instance algo-3 (rank 2) failed: killed by signal SIGKILL"
    )
    await wait_until(lambda: not procs.pid_alive(seen[0]["pid"]), 30, "algo-2 to be stopped")
