"""The node agent with real processes: reports, exit codes, environment, limits and bad input."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from gpuquota.core.lifecycle import algorithm_error
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


async def test_success_reports_starting_running_succeeded(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("print('hello from the job')")))
    report = await wait_final(sched, "job-1-a1")
    assert sched.statuses("job-1-a1") == ["STARTING", "RUNNING", "SUCCEEDED"]
    assert (report.exit_code, report.node_id, report.job_id) == (0, NODE, "job-1")
    assert sched.inputs[0].type == "RegisterNode"
    assert "hello from the job" in (agent.work_dir / "logs" / "job-1-a1.log").read_text()
    for message in sched.inputs:
        assert message.event_id and message.occurred_at > 0
    assert len({m.event_id for m in sched.inputs}) == len(sched.inputs)
    assert agent.active_attempts == []
    await agent.flush(5)  # the delivered attempt is forgotten on disk within a moment; flush writes it now
    assert json.loads(agent.state_path.read_text())["attempts"] == {}


async def test_exit_code_3_fails_with_the_code(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("import sys; sys.stderr.write('boom'); sys.exit(3)")))
    report = await wait_final(sched, "job-1-a1")
    assert sched.statuses("job-1-a1") == ["STARTING", "RUNNING", "FAILED"]
    assert report.exit_code == 3
    assert report.status_reason == algorithm_error("exited with code 3")
    assert "boom" in (agent.work_dir / "logs" / "job-1-a1.log").read_text()


async def test_killed_by_signal_is_named(make_agent: AgentFactory, exit_wrapper: tuple[str, ...]) -> None:
    sched = Scheduler()
    agent = make_agent(sched, exit_wrapper=exit_wrapper)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")))
    report = await wait_final(sched, "job-1-a1")
    assert (report.status, report.exit_code) == ("FAILED", 137)
    assert report.status_reason == algorithm_error("killed by signal SIGKILL")


async def test_environment_of_the_attempt(make_agent: AgentFactory, tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    script = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    payload = python_payload(
        script,
        Environment={"MY_VAR": "x y", "CUDA_VISIBLE_DEVICES": "overridden-by-agent"},
        HyperParameters={"learning-rate": "0.1", "epochs": "3"},
    )
    sched = Scheduler()
    agent = make_agent(sched, slots="ml.g5.xlarge=1,ml.g5.12xlarge=2")
    await agent.start()
    # slots: 0 = g5.xlarge gpu 0; 1 = g5.12xlarge gpus 1-4; 2 = g5.12xlarge gpus 5-8
    await agent.deliver(
        run_cmd(payload, job_id="job-env", attempt_number=2, unit="ml.g5.12xlarge", slots=(2,))
    )
    report = await wait_final(sched, "job-env-a2")
    assert report.status == "SUCCEEDED", report
    env = json.loads(out.read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "5,6,7,8"
    assert env["GPUQUOTA_JOB_ID"] == "job-env"
    assert env["GPUQUOTA_ATTEMPT"] == "2"
    assert env["MY_VAR"] == "x y"
    assert env["SM_HP_LEARNING_RATE"] == "0.1"
    assert env["SM_HP_EPOCHS"] == "3"
    checkpoint = agent.work_dir / "checkpoints" / "job-env"
    assert env["SM_CHECKPOINT_DIR"] == str(checkpoint) and checkpoint.is_dir()
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "ml.g5.12xlarge"


async def test_no_gpus_means_empty_cuda_visible_devices(make_agent: AgentFactory, tmp_path: Path) -> None:
    out = tmp_path / "cvd.txt"
    script = f"import os; open({str(out)!r}, 'w').write(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    local = tmp_path / "my-checkpoints"
    sched = Scheduler()
    agent = make_agent(sched, slots="ml.c5.xlarge=1")  # not a GPU type: no GPU indices
    await agent.start()
    payload = python_payload(
        script, ResourceConfig={"InstanceType": "ml.c5.xlarge"}, CheckpointConfig={"LocalPath": str(local)}
    )
    await agent.deliver(run_cmd(payload, unit="ml.c5.xlarge"))
    assert (await wait_final(sched, "job-1-a1")).status == "SUCCEEDED"
    assert out.read_text() == "''"
    assert local.is_dir()


async def test_max_runtime_is_enforced(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, grace=0.5)
    await agent.start()
    payload = python_payload("import time; time.sleep(60)", StoppingCondition={"MaxRuntimeInSeconds": 1})
    await agent.deliver(run_cmd(payload))
    report = await wait_final(sched, "job-1-a1", timeout=10)
    assert report.status == "FAILED"
    assert report.status_reason == "Attempt exceeded StoppingCondition.MaxRuntimeInSeconds (1 s)"
    assert report.exit_code == 128 + 15  # SIGTERM was enough


async def test_sigterm_ignored_is_sigkilled_after_grace(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import signal, time, pathlib
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path({str(ready)!r}).write_text("ok")
        while True:
            time.sleep(0.1)
        """
    )
    sched = Scheduler()
    agent = make_agent(sched, grace=0.5, exit_wrapper=exit_wrapper)
    await agent.start()
    await agent.deliver(run_cmd(python_payload(script)))
    await wait_until(ready.exists, what="the job to trap SIGTERM")
    await agent.deliver(stop_cmd("job-1", "job-1-a1"))
    report = await wait_final(sched, "job-1-a1")
    assert report.status == "STOPPED" and report.exit_code == 137
    events = {what.split(" sent")[0]: at for at, aid, what in agent.trace if " sent to process group" in what}
    assert events["SIGKILL"] - events["SIGTERM"] >= 0.5


async def test_stop_waits_for_the_whole_process_group(
    make_agent: AgentFactory, tmp_path: Path, exit_wrapper: tuple[str, ...]
) -> None:
    """The leader exits at once on SIGTERM; its child needs 0.3 s more: STOPPED comes after the child."""
    child_done = tmp_path / "child-done"
    ready = tmp_path / "ready"
    child = textwrap.dedent(
        f"""
        import signal, sys, time, pathlib
        def bye(*_):
            time.sleep(0.3)
            pathlib.Path({str(child_done)!r}).write_text(repr(time.time()))
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        pathlib.Path({str(ready)!r}).write_text("ok")
        while True:
            time.sleep(0.05)
        """
    )
    script = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    )
    sched = Scheduler()
    agent = make_agent(sched, grace=5, exit_wrapper=exit_wrapper)
    await agent.start()
    await agent.deliver(run_cmd(python_payload(script)))
    await wait_until(ready.exists, what="the child to start")
    await agent.deliver(stop_cmd("job-1", "job-1-a1"))
    report = await wait_final(sched, "job-1-a1")
    assert report.status == "STOPPED"
    assert child_done.exists(), "STOPPED was reported while the child still ran"
    assert report.occurred_at / 1000 >= float(child_done.read_text()) - 0.01


SM_TRAIN = "/opt/ml/input/data/sm_drivers/sm_train.sh"
BAD_INPUTS = [
    pytest.param(
        json.dumps({"AlgorithmSpecification": {}, "ResourceConfig": {"InstanceType": "ml.g5.xlarge"}}),
        "ml.g5.xlarge",
        "No command to run",
        id="no-command",
    ),
    pytest.param(
        json.dumps({"AlgorithmSpecification": {"ContainerEntrypoint": ["/no/such/trainer", "--x"]}}),
        "ml.g5.xlarge",
        "command not found: /no/such/trainer",
        id="command-not-found",
    ),
    pytest.param(  # the SageMaker SDK's SourceCode command (sagemaker.train's sm_drivers)
        json.dumps(
            {
                "AlgorithmSpecification": {
                    "ContainerEntrypoint": ["/bin/bash"],
                    "ContainerArguments": ["-c", f"chmod +x {SM_TRAIN} && {SM_TRAIN}"],
                }
            }
        ),
        "ml.g5.xlarge",
        "The command uses /opt/ml/input/data/sm_drivers/sm_train.sh, a SageMaker container path the "
        "process runtime lacks: run it on a node agent with --runtime container",
        id="sdk-container-path",
    ),  # fmt: skip
    pytest.param("{not json", "ml.g5.xlarge", "Invalid serviceRequestPayload: not valid JSON", id="bad-json"),
    pytest.param(
        json.dumps({"AlgorithmSpecification": {"ContainerEntrypoint": "python"}}),
        "ml.g5.xlarge",
        "ContainerEntrypoint must be a list of strings",
        id="bad-entrypoint",
    ),
    pytest.param(
        python_payload("pass", ResourceConfig={"InstanceType": "ml.p5.48xlarge"}),
        "ml.p5.48xlarge",
        "Instance type ml.p5.48xlarge is not offered by node node-1 (offers: ml.g5.xlarge)",
        id="unit-not-offered",
    ),
    pytest.param(
        python_payload("pass", ResourceConfig={"InstanceType": "ml.p4d.24xlarge"}),
        "ml.g5.xlarge",
        "Instance type ml.p4d.24xlarge is not offered",
        id="payload-instance-type-not-offered",
    ),
]


@pytest.mark.parametrize(("payload", "unit", "reason"), BAD_INPUTS)
async def test_bad_input_fails_the_attempt_not_the_agent(
    make_agent: AgentFactory, payload: str, unit: str, reason: str
) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(payload, unit=unit))
    report = await wait_final(sched, "job-1-a1")
    assert sched.statuses("job-1-a1") == ["STARTING", "FAILED"]
    assert report.status_reason is not None and reason in report.status_reason, report.status_reason
    # the agent keeps working
    await agent.deliver(run_cmd(python_payload("pass"), job_id="job-2"))
    assert (await wait_final(sched, "job-2-a1")).status == "SUCCEEDED"


async def test_unusable_checkpoint_dir_fails_the_attempt(make_agent: AgentFactory, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    payload = python_payload("pass", CheckpointConfig={"LocalPath": str(blocker / "ckpt")})
    await agent.deliver(run_cmd(payload))
    report = await wait_final(sched, "job-1-a1")
    assert report.status == "FAILED"
    assert (
        report.status_reason == f"Checkpoint directory {blocker / 'ckpt'} cannot be created: Not a directory"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
async def test_unreadable_checkpoint_dir_fails_the_attempt(make_agent: AgentFactory, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    try:
        sched = Scheduler()
        agent = make_agent(sched)
        await agent.start()
        await agent.deliver(run_cmd(python_payload("pass", CheckpointConfig={"LocalPath": str(locked)})))
        report = await wait_final(sched, "job-1-a1")
        assert report.status == "FAILED"
        assert report.status_reason == f"Checkpoint directory {locked} is not readable and writable"
    finally:
        locked.chmod(0o700)


async def test_slot_of_another_unit_fails(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, slots="ml.g5.xlarge=1,ml.g5.12xlarge=1")
    await agent.start()
    await agent.deliver(run_cmd(python_payload("pass"), slots=(1,)))
    report = await wait_final(sched, "job-1-a1")
    assert report.status_reason == "Node node-1 has no ml.g5.xlarge slot 1"


async def test_duplicate_run_attempt_is_ignored(make_agent: AgentFactory, tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    script = f"open({str(counter)!r}, 'a').write('x')"
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    cmd = run_cmd(python_payload(script))
    await agent.deliver(cmd)
    await agent.deliver(cmd)  # while it runs
    await wait_final(sched, "job-1-a1")
    await agent.deliver(cmd)  # after it finished
    await agent.deliver(stop_cmd("job-1", "job-1-a1"))  # stop of a finished attempt: ignored
    await agent.flush(5)
    assert sched.statuses("job-1-a1") == ["STARTING", "RUNNING", "SUCCEEDED"]
    assert counter.read_text() == "x"


async def test_commands_for_other_nodes_and_unknown_attempts_are_ignored(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("pass"), node_id="node-2"))
    await agent.deliver(stop_cmd("job-x", "never-ran"))
    await agent.flush(5)
    assert sched.types() == ["RegisterNode"]
    assert agent.active_attempts == []


async def test_reports_are_resent_in_order_after_send_failures(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    sched.fail_next = 4  # RegisterNode and the first reports fail a few times
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("pass")))
    await wait_final(sched, "job-1-a1")
    assert agent.send_failures == 4
    assert sched.types() == ["RegisterNode", "AttemptReport", "AttemptReport", "AttemptReport"]
    assert sched.statuses("job-1-a1") == ["STARTING", "RUNNING", "SUCCEEDED"]
    # a later outage: reports wait in the outbox and arrive once the scheduler answers again
    sched.fail_next = 10**9
    await agent.deliver(run_cmd(python_payload("pass"), job_id="job-2"))
    await wait_until(lambda: agent.send_failures >= 10, what="retries during the outage")
    assert sched.reports("job-2-a1") == []
    sched.fail_next = 0
    assert (await wait_final(sched, "job-2-a1")).status == "SUCCEEDED"
    assert sched.statuses("job-2-a1") == ["STARTING", "RUNNING", "SUCCEEDED"]


async def test_heartbeats(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, heartbeat=0.02)
    await agent.start()
    await wait_until(lambda: sched.types().count("NodeHeartbeat") >= 3, what="heartbeats")
    assert sched.types()[0] == "RegisterNode"


async def test_drain_waits_for_attempts_then_deregisters(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("import time; time.sleep(0.3)")))
    await wait_until(lambda: "RUNNING" in sched.statuses("job-1-a1"), what="RUNNING")
    await agent.drain()
    assert sched.types()[-3:] == ["DrainNode", "AttemptReport", "DeregisterNode"]
    assert sched.final("job-1-a1") is not None and sched.final("job-1-a1").status == "SUCCEEDED"  # type: ignore[union-attr]


async def test_drain_timeout_hands_attempts_back(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, grace=0.5)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("import time; time.sleep(60)")))
    await wait_until(lambda: "RUNNING" in sched.statuses("job-1-a1"), what="RUNNING")
    await agent.drain(timeout=0.2)
    report = sched.final("job-1-a1")
    assert report is not None and report.status == "STOPPED"
    assert report.status_reason == "Node node-1 drained: attempt handed back"
    assert sched.types()[-1] == "DeregisterNode"
