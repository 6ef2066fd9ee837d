"""The ``container`` runtime with real podman (I6): SageMaker's contract, failure reasons, preemption
with checkpoint and resume, adoption after an agent restart, and 2-instance attempts."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.node_agent import NodeAgent
from gpuquota.node_agent.container import ContainerEngine, ContainerRuntime, describe_exit
from gpuquota.wire.node_commands import GangNode
from tests.containers import build_trainer_image, find_engine, remove_job_containers, unique
from tests.node_agent.conftest import AgentFactory, Scheduler, run_cmd, stop_cmd, wait_final, wait_until

pytestmark = pytest.mark.slow
TIMEOUT = 90.0  # a loaded machine starts containers slowly


@pytest.fixture(scope="module")
def engine() -> ContainerEngine:
    return find_engine()


@pytest.fixture(scope="module")
def image(engine: ContainerEngine) -> str:
    return build_trainer_image(engine)


@pytest.fixture
def job_ids(engine: ContainerEngine) -> Iterator[list[str]]:
    """Job ids of the test; their containers are removed afterwards."""
    ids: list[str] = []
    yield ids
    for job_id in ids:
        remove_job_containers(engine, job_id)


def container_agent(
    make_agent: AgentFactory, sched: Scheduler, engine: ContainerEngine, **kw: Any
) -> NodeAgent:
    """An agent with the container runtime on slots without GPUs (no NVML here: no GPU flag)."""
    return make_agent(sched, runtime=ContainerRuntime(engine), with_gpus=False, **kw)


def new_job(job_ids: list[str], prefix: str) -> str:
    job_ids.append(unique(prefix))
    return job_ids[-1]


def payload(image: str, hyperparameters: dict[str, str], count: int = 1, **extra: Any) -> str:
    doc: dict[str, Any] = {
        "TrainingJobName": "t",
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "HyperParameters": hyperparameters,
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": count, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        **extra,
    }
    return json.dumps(doc)


def model_dir(work: Path, attempt_id: str, host: str = "algo-1") -> Path:
    return work / "attempts" / attempt_id / host / "model"


def env_of(model: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (model / "env").read_text().splitlines() if "=" in line)


def containers(engine: ContainerEngine, job_id: str) -> list[str]:
    listed = subprocess.run(
        engine.argv("ps", "--all", "--format", "{{.Names}}", "--filter", f"label=gpuquota.job_id={job_id}"),
        capture_output=True,
        text=True,
    )
    return listed.stdout.split()


async def test_sagemaker_contract_hyperparameters_channel_checkpoint_and_model(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.csv").write_text("1,2,3\n")
    job = new_job(job_ids, "contract")
    sched = Scheduler()
    agent = container_agent(make_agent, sched, engine)
    await agent.start()
    doc = payload(
        image,
        {"steps": "2", "sleep": "0.05", "learning-rate": "0.1"},
        Environment={"MY_VAR": "x"},
        InputDataConfig=[
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3Uri": f"file://{data}", "S3DataType": "S3Prefix"}},
            }
        ],
        CheckpointConfig={"S3Uri": "s3://bucket/ckpt", "LocalPath": "/opt/ml/my-checkpoints"},
    )
    await agent.deliver(run_cmd(doc, job_id=job))
    report = await wait_final(sched, f"{job}-a1", TIMEOUT)
    assert (report.status, report.exit_code) == ("SUCCEEDED", 0), report.status_reason
    model = model_dir(agent.work_dir, f"{job}-a1")
    assert (model / "done").read_text().strip() == "2"
    assert json.loads((model / "hyperparameters.json").read_text())["learning-rate"] == "0.1"
    assert json.loads((model / "resourceconfig.json").read_text())["hosts"] == ["algo-1"]
    assert "train" in json.loads((model / "inputdataconfig.json").read_text())
    assert (model / "channel-train").read_text() == "1,2,3\n"
    assert (model / "argv").read_text().strip() == "train"  # SageMaker's "<image> train"
    assert (model / "checkpoint-writable").exists()
    env = env_of(model)
    assert env["SM_HP_LEARNING_RATE"] == "0.1" and env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert env["SM_CHANNELS"] == '["train"]' and env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_CHECKPOINT_DIR"] == "/opt/ml/my-checkpoints" and env["SM_CURRENT_HOST"] == "algo-1"
    assert env["SM_HOSTS"] == '["algo-1"]' and env["SM_NUM_GPUS"] == "0"
    assert env["GPUQUOTA_JOB_ID"] == job and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "CUDA_VISIBLE_DEVICES" not in env and "MASTER_ADDR" not in env
    # the job's checkpoint directory on the node, kept across attempts
    assert (agent.work_dir / "checkpoints" / job / "step").read_text().strip() == "2"
    assert "step 2" in (agent.work_dir / "logs" / f"{job}-a1.log").read_text()
    await wait_until(lambda: not containers(engine, job), TIMEOUT, "the container to be removed")


async def test_failure_file_becomes_the_status_reason_and_entrypoint_arguments_override(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str]
) -> None:
    job = new_job(job_ids, "failure")
    sched = Scheduler()
    agent = container_agent(make_agent, sched, engine)
    await agent.start()
    algorithm = {
        "TrainingImage": image,
        "ContainerEntrypoint": ["/bin/busybox", "sh", "/trainer.sh", "--from-entrypoint"],
        "ContainerArguments": ["--epochs", "1"],
    }
    doc = payload(image, {"fail": "Loss diverged at step 0"}, AlgorithmSpecification=algorithm)
    await agent.deliver(run_cmd(doc, job_id=job))
    report = await wait_final(sched, f"{job}-a1", TIMEOUT)
    assert (report.status, report.exit_code) == ("FAILED", 3)
    assert report.status_reason == algorithm_error("Loss diverged at step 0")
    argv = (model_dir(agent.work_dir, f"{job}-a1") / "argv").read_text().split()
    assert argv == ["--from-entrypoint", "--epochs", "1"]


async def test_channels_that_are_not_on_the_node_and_missing_images_fail_at_launch(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str]
) -> None:
    job = new_job(job_ids, "launch")
    sched = Scheduler()
    agent = container_agent(make_agent, sched, engine)
    await agent.start()
    s3 = [{"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": "s3://bucket/train"}}}]
    await agent.deliver(run_cmd(payload(image, {}, InputDataConfig=s3), job_id=job))
    report = await wait_final(sched, f"{job}-a1", TIMEOUT)
    assert report.status == "FAILED" and report.status_reason is not None
    assert "Channel train: s3://bucket/train is not on this node" in report.status_reason
    no_image = json.dumps({"AlgorithmSpecification": {"TrainingInputMode": "File"}})
    await agent.deliver(run_cmd(no_image, job_id=job, attempt_number=2))
    report = await wait_final(sched, f"{job}-a2", TIMEOUT)
    assert report.status_reason == "No image to run: the payload has no AlgorithmSpecification.TrainingImage"


def test_exit_reasons_are_readable() -> None:
    assert describe_exit(137, True, None) == "Container killed: out of memory (OOMKilled, exit code 137)"
    assert describe_exit(137, False, None) == "Container killed by signal SIGKILL (exit code 137)"
    assert describe_exit(2, False, None) == "exited with code 2"
    assert describe_exit(2, False, "bad input") == "bad input"


async def test_preemption_sigterm_checkpoint_gone_then_the_next_attempt_resumes(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str]
) -> None:
    job = new_job(job_ids, "preempt")
    sched = Scheduler()
    agent = container_agent(make_agent, sched, engine, grace=20)
    await agent.start()
    step_file = agent.work_dir / "checkpoints" / job / "step"
    await agent.deliver(run_cmd(payload(image, {"steps": "100000", "sleep": "0.05"}), job_id=job))
    await wait_until(
        lambda: step_file.exists() and int(step_file.read_text() or 0) >= 3, TIMEOUT, "some training"
    )
    await agent.deliver(stop_cmd(job, f"{job}-a1", "Preempted (cross-share): capacity reclaimed"))
    report = await wait_final(sched, f"{job}-a1", TIMEOUT)
    assert report.status == "STOPPED"
    assert not containers(engine, job), "reported stopped only once the container is gone"
    assert (agent.work_dir / "checkpoints" / job / "events").read_text().startswith("sigterm at step")
    saved = int(step_file.read_text())
    assert saved >= 3

    await agent.deliver(
        run_cmd(payload(image, {"steps": str(saved + 2), "sleep": "0.01"}), job_id=job, attempt_number=2)
    )
    report = await wait_final(sched, f"{job}-a2", TIMEOUT)
    assert report.status == "SUCCEEDED", report.status_reason
    assert int((model_dir(agent.work_dir, f"{job}-a2") / "resumed_from").read_text()) == saved


async def test_restarted_agent_adopts_a_running_container_and_records_a_finished_one(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str], tmp_path: Path
) -> None:
    running, finishing = new_job(job_ids, "adopt"), new_job(job_ids, "ended")
    work = tmp_path / "work"
    sched1 = Scheduler()
    agent1 = container_agent(make_agent, sched1, engine, work_dir=work)
    await agent1.start()
    await agent1.deliver(run_cmd(payload(image, {"steps": "100000", "sleep": "0.05"}), job_id=running))
    await agent1.deliver(run_cmd(payload(image, {"steps": "50", "sleep": "0.1"}), job_id=finishing))
    both = (f"{running}-a1", f"{finishing}-a1")
    await wait_until(lambda: all("RUNNING" in sched1.statuses(a) for a in both), TIMEOUT, "RUNNING")
    await agent1.stop()  # the agent dies; its containers run on
    await wait_until(
        lambda: (model_dir(work, f"{finishing}-a1") / "done").exists(), TIMEOUT, "the short job to end"
    )
    assert containers(engine, running) and containers(engine, finishing)

    sched2 = Scheduler()
    agent2 = container_agent(make_agent, sched2, engine, work_dir=work)
    await agent2.start()
    ended = await wait_final(sched2, f"{finishing}-a1", TIMEOUT)
    assert (ended.status, ended.exit_code) == ("SUCCEEDED", 0), "the exit code recorded by the engine"
    await wait_until(lambda: f"{running}-a1" in agent2.active_attempts, TIMEOUT, "adoption")
    assert containers(engine, running) == [f"gpuquota-node-1-{running}-a1-algo-1"], "nothing runs twice"
    await agent2.deliver(stop_cmd(running, f"{running}-a1", "The scheduler does not assign this attempt"))
    stopped = await wait_final(sched2, f"{running}-a1", TIMEOUT)
    assert stopped.status == "STOPPED"
    assert not containers(engine, running) and not containers(engine, finishing)
    assert (work / "checkpoints" / running / "events").read_text().startswith("sigterm at step")


async def test_two_instances_share_hosts_resolve_each_other_and_one_failure_stops_the_other(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str]
) -> None:
    job = new_job(job_ids, "multi")
    sched = Scheduler()
    agent = container_agent(make_agent, sched, engine, slots="ml.g5.xlarge=2", grace=20)
    await agent.start()
    hps = {"steps": "2", "sleep": "0.05", "resolve": "algo-1"}
    await agent.deliver(run_cmd(payload(image, hps, count=2), job_id=job, slots=(0, 1)))
    report = await wait_final(sched, f"{job}-a1", TIMEOUT)
    assert report.status == "SUCCEEDED", report.status_reason
    envs = [env_of(model_dir(agent.work_dir, f"{job}-a1", host)) for host in ("algo-1", "algo-2")]
    assert {e["SM_HOSTS"] for e in envs} == {'["algo-1", "algo-2"]'}
    assert [e["SM_CURRENT_HOST"] for e in envs] == ["algo-1", "algo-2"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("2", "algo-1", "29500")}
    assert (model_dir(agent.work_dir, f"{job}-a1", "algo-2") / "resolved").exists(), "algo-1 resolves"

    hps = {"steps": "100000", "sleep": "0.05", "fail": "NCCL timeout", "fail_host": "algo-2"}
    await agent.deliver(run_cmd(payload(image, hps, count=2), job_id=job, slots=(0, 1), attempt_number=2))
    report = await wait_final(sched, f"{job}-a2", TIMEOUT)
    assert report.status == "FAILED"
    assert report.status_reason == algorithm_error("Instance algo-2 (rank 1) failed: NCCL timeout")
    assert not containers(engine, job), "the failure stopped the other instance"
    assert "sigterm at step" in (agent.work_dir / "checkpoints" / job / "events").read_text()


async def test_restarted_agent_adopts_every_instance_of_a_two_instance_attempt(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str], tmp_path: Path
) -> None:
    job = new_job(job_ids, "multi-adopt")
    work = tmp_path / "work"
    sched1 = Scheduler()
    agent1 = container_agent(make_agent, sched1, engine, work_dir=work, grace=20)
    await agent1.start()
    hps = {"steps": "100000", "sleep": "0.05"}
    await agent1.deliver(run_cmd(payload(image, hps, count=2), job_id=job, slots=(0, 1)))
    await wait_until(lambda: "RUNNING" in sched1.statuses(f"{job}-a1"), TIMEOUT, "RUNNING")
    await agent1.stop()  # the agent dies; both containers run on
    assert len(containers(engine, job)) == 2

    sched2 = Scheduler()
    agent2 = container_agent(make_agent, sched2, engine, work_dir=work, grace=20)
    await agent2.start()
    await wait_until(lambda: f"{job}-a1" in agent2.active_attempts, TIMEOUT, "adoption")
    assert len(containers(engine, job)) == 2, "nothing runs twice"
    await agent2.deliver(stop_cmd(job, f"{job}-a1", "Preempted (cross-share): test"))
    assert (await wait_final(sched2, f"{job}-a1", TIMEOUT)).status == "STOPPED"
    assert not containers(engine, job)
    networks = subprocess.run(
        engine.argv("network", "ls", "--format", "{{.Name}}"), capture_output=True, text=True
    )
    assert job not in networks.stdout, "the attempt's network is removed with its containers"


async def test_a_container_its_dead_agent_never_recorded_is_removed_at_restart(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str], tmp_path: Path
) -> None:
    stray, other = new_job(job_ids, "stray"), new_job(job_ids, "other")
    work = tmp_path / "work"
    long = payload(image, {"steps": "100000", "sleep": "0.05"})
    agent1, neighbour = Scheduler(), Scheduler()
    dying = container_agent(make_agent, agent1, engine, work_dir=work)
    elsewhere = container_agent(make_agent, neighbour, engine, work_dir=tmp_path / "elsewhere")
    for agent in (dying, elsewhere):
        await agent.start()
    await dying.deliver(run_cmd(long, job_id=stray))
    await elsewhere.deliver(run_cmd(long, job_id=other))  # same node id, another agent's work dir
    await wait_until(lambda: "RUNNING" in agent1.statuses(f"{stray}-a1"), TIMEOUT, "RUNNING")
    await wait_until(lambda: "RUNNING" in neighbour.statuses(f"{other}-a1"), TIMEOUT, "RUNNING")
    await dying.stop()
    # as if it died between starting the container and recording it in state.json
    (work / "state.json").write_text(json.dumps({"node_id": "node-1", "attempts": {}}))

    sched2 = Scheduler()
    await container_agent(make_agent, sched2, engine, work_dir=work).start()
    assert not containers(engine, stray), "the unrecorded container is removed: it never runs twice"
    assert sched2.reports() == []
    assert len(containers(engine, other)) == 1, "another agent's container is left alone"


async def test_two_instances_on_two_nodes_share_hosts_and_rendezvous_over_the_hosts_network(
    make_agent: AgentFactory, engine: ContainerEngine, image: str, job_ids: list[str], tmp_path: Path
) -> None:
    """Two agents on this machine, one instance each, as the scheduler places a gang over two nodes."""
    job = new_job(job_ids, "gang")
    gang = (
        GangNode(node_id="node-a", instances=1, first_rank=0, address="127.0.0.1"),
        GangNode(node_id="node-b", instances=1, first_rank=1, address="localhost"),
    )
    sched = Scheduler()
    agents = [
        container_agent(
            make_agent,
            sched,
            engine,
            slots="ml.g5.xlarge=1",
            node_id=n.node_id,
            work_dir=tmp_path / n.node_id,
        )
        for n in gang
    ]
    for agent in agents:
        await agent.start()
    hps = {"steps": "2", "sleep": "0.05"}
    for agent in agents:
        cmd = run_cmd(payload(image, hps, count=2), job_id=job, node_id=agent.node_id)
        await agent.deliver(cmd.model_copy(update={"gang": gang}))
    report = await wait_final(sched, f"{job}-a1", TIMEOUT)
    await wait_until(
        lambda: len([r for r in sched.reports(f"{job}-a1") if r.status == "SUCCEEDED"]) == 2, TIMEOUT
    )
    assert report.status == "SUCCEEDED", report.status_reason
    models = [
        model_dir(a.work_dir, f"{job}-a1", host) for a, host in zip(agents, ("algo-1", "algo-2"), strict=True)
    ]
    envs = [env_of(model) for model in models]
    assert {e["SM_HOSTS"] for e in envs} == {'["algo-1", "algo-2"]'}
    assert [(e["SM_CURRENT_HOST"], e["NODE_RANK"]) for e in envs] == [("algo-1", "0"), ("algo-2", "1")]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"]) for e in envs} == {("2", "127.0.0.1")}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    # each node's final report says where its instance's /opt/ml/model is
    outputs = {r.node_id: r.outputs for r in sched.reports(f"{job}-a1") if r.status == "SUCCEEDED"}
    assert [o.model_dir for o in outputs["node-a"] + outputs["node-b"]] == [str(m) for m in models]
    assert all((m / "done").exists() for m in models)
