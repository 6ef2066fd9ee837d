"""A 2-instance job placed on two 1-slot nodes (two node agents of one embedded stack, ``process``
runtime): both instances see the same host list, their own ranks and the same rendezvous; one
failing instance fails the attempt once and the other node's instance is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.ctl.api import Api
from gpuquota.ctl.commands import format_explain, format_job
from gpuquota.ctl.render import Style
from gpuquota.entrypoints.embedded import LOCAL_ADDRESS, EmbeddedStack
from gpuquota.node_agent import NodeAgent, ProcessRuntime, procs
from gpuquota.wire import events as ev
from gpuquota.wire.base import SlotOffer
from tests.e2e.conftest import apoll, batch_client, log_events
from tests.gateway.helpers import G5, create_queue, create_share, submit

INSTANCE = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    out = pathlib.Path(os.environ["OUT_DIR"])
    keys = ("SM_HOSTS", "SM_CURRENT_HOST", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK",
            "GPUQUOTA_NODE_ID", "SM_MODEL_DIR")
    me = os.environ["SM_CURRENT_HOST"]
    pathlib.Path(os.environ["SM_MODEL_DIR"], "model.txt").write_text(f"weights of {me}")
    (out / f"{me}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}))
    hosts, deadline = json.loads(os.environ["SM_HOSTS"]), time.monotonic() + 60
    while not all((out / f"{h}.json").exists() for h in hosts) and time.monotonic() < deadline:
        time.sleep(0.01)  # every instance has started (and written its file)
    if os.environ.get("FAIL_HOST") == me:
        sys.exit(7)
    time.sleep(float(os.environ.get("SLEEP", "0")))
    """
)


class TwoNodes:
    def __init__(self, stack: EmbeddedStack, out: Path) -> None:
        self.stack = stack
        self.out = out
        self.batch: Any = batch_client(stack.url)

    def payload(self, **env: str) -> str:
        return json.dumps(
            {
                "AlgorithmSpecification": {"ContainerEntrypoint": [sys.executable, "-c", INSTANCE]},
                "ResourceConfig": {"InstanceType": G5, "InstanceCount": 2},
                "Environment": {"OUT_DIR": str(self.out), **env},
            }
        )

    async def describe(self, job_id: str, status: str) -> dict[str, Any] | None:
        """The job once it has ``status`` (boto3 blocks: it runs in a thread, the stack in this loop)."""
        job: dict[str, Any] = await asyncio.to_thread(lambda: self.batch.describe_service_job(jobId=job_id))
        return job if job["status"] == status else None

    def seen(self, host: str) -> dict[str, Any] | None:
        path = self.out / f"{host}.json"
        return json.loads(path.read_text()) if path.exists() else None

    async def events(self) -> list[ev.SchedulerEvent]:
        assert self.stack.store is not None
        return await log_events(self.stack.store, "default")

    def kill_all(self) -> None:
        for host in ("algo-1", "algo-2"):
            seen = self.seen(host)
            if seen is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(seen["pid"]), signal.SIGKILL)


@pytest_asyncio.fixture
async def two_nodes(tmp_path: Path) -> AsyncIterator[TwoNodes]:
    stack = EmbeddedStack(
        tmp_path / "stack", port=0, nodes="", tick_seconds=0.1, heartbeat_seconds=0.5, preemption_grace=5
    )
    await stack.start()
    assert stack.shell is not None
    for node_id in ("node-a", "node-b"):
        agent = NodeAgent(
            node_id,
            "default",
            (SlotOffer(unit=G5),),
            ProcessRuntime(),
            stack.shell.handle,
            tmp_path / node_id,
            heartbeat_seconds=0.5,
            preemption_grace=5,
            address=LOCAL_ADDRESS,
        )
        stack.agents[node_id] = agent
        await agent.start()
    (tmp_path / "out").mkdir()
    nodes = TwoNodes(stack, tmp_path / "out")
    await apoll(lambda: len(stack.shell.state.nodes) == 2 if stack.shell else False, 30, "two nodes")
    await asyncio.to_thread(create_queue, nodes.batch, 2)
    await asyncio.to_thread(create_share, nodes.batch, "QS", "RESERVE", 2)
    try:
        yield nodes
    finally:
        nodes.kill_all()
        await stack.stop()
        nodes.batch.close()


async def test_two_instances_on_two_nodes_agree_on_hosts_ranks_and_rendezvous(two_nodes: TwoNodes) -> None:
    batch = two_nodes.batch
    job_id = await asyncio.to_thread(submit, batch, "gang", "QS", serviceRequestPayload=two_nodes.payload())
    job = await apoll(lambda: two_nodes.describe(job_id, "SUCCEEDED"), 60, "the job to succeed")
    seen = [two_nodes.seen(host) for host in ("algo-1", "algo-2")]
    assert all(s is not None for s in seen)
    first, second = (s for s in seen if s is not None)
    assert {first["SM_HOSTS"], second["SM_HOSTS"]} == {'["algo-1", "algo-2"]'}
    assert (first["NODE_RANK"], second["NODE_RANK"]) == ("0", "1")
    assert {first["GPUQUOTA_NODE_ID"], second["GPUQUOTA_NODE_ID"]} == {"node-a", "node-b"}
    assert first["WORLD_SIZE"] == second["WORLD_SIZE"] == "2"
    assert first["MASTER_ADDR"] == second["MASTER_ADDR"] == LOCAL_ADDRESS
    assert first["MASTER_PORT"] == second["MASTER_PORT"]
    events = [e for e in await two_nodes.events() if getattr(e, "job_id", None) == job_id]
    assert [e.node_id for e in events if isinstance(e, ev.AttemptPartEnded)]  # the first part waited
    assert len([e for e in events if isinstance(e, ev.JobSucceeded)]) == 1
    # the attempt says where each instance kept /opt/ml/model: what the job wrote to $SM_MODEL_DIR is there
    assert "gpuquotaOutputs" not in job["attempts"][0]  # boto3 keeps only the keys AWS's model has
    described = await asyncio.to_thread(Api(two_nodes.stack.url).call, "describe_service_job", jobId=job_id)
    (attempt,) = described["attempts"]
    outputs = sorted(attempt["gpuquotaOutputs"], key=lambda o: o["host"])
    assert [(o["host"], o["nodeId"]) for o in outputs] == [
        ("algo-1", first["GPUQUOTA_NODE_ID"]),
        ("algo-2", second["GPUQUOTA_NODE_ID"]),
    ]
    for output, seen_by in zip(outputs, (first, second), strict=True):
        assert output["modelDir"] == seen_by["SM_MODEL_DIR"]
        assert (Path(output["modelDir"]) / "model.txt").read_text() == f"weights of {output['host']}"
        assert Path(output["outputDir"]).is_dir()
    # gpuquota jobs describe prints them
    printed = format_job(described, Style(False))
    assert "Model and output of attempt 1" in printed and outputs[1]["modelDir"] in printed
    explained = await asyncio.to_thread(Api(two_nodes.stack.url).explain, job_id)
    assert explained["outputs"] == attempt["gpuquotaOutputs"]
    assert outputs[0]["modelDir"] in format_explain(explained, Style(False))


async def test_one_failing_instance_fails_the_attempt_and_stops_the_other_node(two_nodes: TwoNodes) -> None:
    batch = two_nodes.batch
    payload = two_nodes.payload(FAIL_HOST="algo-2", SLEEP="600")
    job_id = await asyncio.to_thread(submit, batch, "gang", "QS", serviceRequestPayload=payload)
    survivor = await apoll(lambda: two_nodes.seen("algo-1"), 60, "algo-1 to start")
    job = await apoll(lambda: two_nodes.describe(job_id, "FAILED"), 60, "the job to fail")
    assert job["statusReason"] == algorithm_error("Instance algo-2 (rank 1) failed: exited with code 7")
    assert not procs.pid_alive(survivor["pid"]), "the other node's instance is gone before the attempt ends"
    events = [e for e in await two_nodes.events() if getattr(e, "job_id", None) == job_id]
    ends = [
        type(e).__name__ for e in events if isinstance(e, ev.JobFailed | ev.JobRequeued | ev.JobSucceeded)
    ]
    assert ends == ["JobFailed"]
    (stop,) = [e for e in events if isinstance(e, ev.JobStopRequested)]
    assert (stop.cause, stop.status_reason) == ("INSTANCE_FAILED", job["statusReason"])
