"""Helpers for the node agent tests: an in-memory ``send`` twin, payload builders, polling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuquota.node_agent import NodeAgent, ProcessRuntime, Runtime, native_wrapper, parse_slots
from gpuquota.node_agent.sending import SendMany
from gpuquota.wire.inputs import AttemptReport, SchedulerInput
from gpuquota.wire.node_commands import RunAttempt, StopAttempt

NODE = "node-1"


class Scheduler:
    """The in-memory twin of the transport: collects what the agent sends; can fail on purpose."""

    def __init__(self) -> None:
        self.inputs: list[SchedulerInput] = []
        self.fail_next = 0
        self.attempted = 0

    async def send(self, message: SchedulerInput) -> None:
        self.attempted += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ConnectionError("scheduler unreachable")
        self.inputs.append(message)

    def reports(self, attempt_id: str | None = None) -> list[AttemptReport]:
        return [
            m
            for m in self.inputs
            if isinstance(m, AttemptReport) and (attempt_id is None or m.attempt_id == attempt_id)
        ]

    def statuses(self, attempt_id: str) -> list[str]:
        return [r.status for r in self.reports(attempt_id)]

    def types(self) -> list[str]:
        return [m.type for m in self.inputs]

    def final(self, attempt_id: str) -> AttemptReport | None:
        for r in self.reports(attempt_id):
            if r.status in ("SUCCEEDED", "FAILED", "STOPPED"):
                return r
        return None


async def wait_until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Polls ``cond`` until it is truthy; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def wait_final(sched: Scheduler, attempt_id: str, timeout: float = 10.0) -> AttemptReport:
    report: AttemptReport = await wait_until(
        lambda: sched.final(attempt_id), timeout, f"final report of {attempt_id}"
    )
    return report


def python_payload(script: str, **extra: Any) -> str:
    """A CreateTrainingJob request running ``python -c script``."""
    doc: dict[str, Any] = {
        "TrainingJobName": "t",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "ContainerEntrypoint": [sys.executable, "-c"],
            "ContainerArguments": [script],
        },
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return json.dumps(doc)


def run_cmd(
    payload: str,
    *,
    job_id: str = "job-1",
    attempt_id: str | None = None,
    attempt_number: int = 1,
    unit: str = "ml.g5.xlarge",
    slots: tuple[int, ...] = (0,),
    node_id: str = NODE,
) -> RunAttempt:
    return RunAttempt(
        event_id=str(uuid.uuid4()),
        occurred_at=int(time.time() * 1000),
        node_id=node_id,
        job_id=job_id,
        job_name=job_id,
        attempt_id=attempt_id or f"{job_id}-a{attempt_number}",
        attempt_number=attempt_number,
        unit=unit,
        slots=slots,
        payload=payload,
    )


def stop_cmd(job_id: str, attempt_id: str, reason: str = "Preempted (cross-share): test") -> StopAttempt:
    return StopAttempt(
        event_id=str(uuid.uuid4()),
        occurred_at=int(time.time() * 1000),
        node_id=NODE,
        job_id=job_id,
        attempt_id=attempt_id,
        reason=reason,
    )


def _kill_recorded(work_dir: Path) -> None:
    try:
        doc = json.loads((work_dir / "state.json").read_text())
    except (OSError, ValueError):
        return
    for record in (doc.get("attempts") or {}).values():
        pgid = record.get("pgid")
        if pgid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


AgentFactory = Callable[..., NodeAgent]


@pytest.fixture(params=["c", "python"])
def exit_wrapper(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """Each exit wrapper's command (``make_agent(..., exit_wrapper=...)``); the C one only where it was
    built, except in CI, where `make test` builds it first (`make native`): a failed build must show."""
    if request.param == "python":
        return native_wrapper.python_command()
    native = native_wrapper.native_command()
    if native is None:
        if os.environ.get("CI"):
            pytest.fail("the C exit wrapper was not built (make native)")
        pytest.skip("the C exit wrapper is not built here (make native)")
    return native


@pytest.fixture
async def make_agent(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    """Builds started-later agents on ``tmp_path/work``; kills whatever they leave running."""
    agents: list[NodeAgent] = []

    def factory(
        sched: Scheduler,
        *,
        runtime: Runtime | None = None,
        slots: str = "ml.g5.xlarge=2",
        work_dir: Path | None = None,
        grace: float = 0.5,
        heartbeat: float = 60.0,
        node_id: str = NODE,
        send_many: SendMany | None = None,
        exit_wrapper: tuple[str, ...] | None = None,
        with_gpus: bool = True,
    ) -> NodeAgent:
        agent = NodeAgent(
            node_id,
            "default",
            parse_slots(slots, with_gpus=with_gpus),
            runtime or ProcessRuntime(poll_seconds=0.01, exit_wrapper=exit_wrapper),
            sched.send,
            work_dir or tmp_path / "work",
            heartbeat_seconds=heartbeat,
            preemption_grace=grace,
            retry_seconds=0.01,
            max_retry_seconds=0.05,
            send_many=send_many,
        )
        agents.append(agent)
        return agent

    yield factory
    for agent in agents:
        _kill_recorded(agent.work_dir)
        await agent.stop(flush_timeout=0.1)
