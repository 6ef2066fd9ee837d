"""The fault tests' harness: ``gpuquota up`` as an OS process, a client that submits through crashes,
and the checks every fault test makes once the system has settled.

Each job is ``/bin/sh`` appending its attempt id to ``runs`` (so a second run of an attempt shows),
then waiting ``sleep`` seconds or until the file ``release`` exists, and exiting 0. The client
submits with a ``clientToken`` per job and retries a submission whose answer it did not get (the
stack is down, or died while answering) with the same token until it gets one: the job is then
*acknowledged*. ``settle`` waits until every acknowledged job is terminal, then ``check`` reads the
event log (SQLite or PostgreSQL) and asserts:

- every acknowledged job reaches exactly one terminal state, and each token made exactly one job;
- no attempt id ran twice (``runs``);
- after replaying the log, no job holds capacity and every node's free slots are all its slots
  (capacity used equals attempts running: none);
- a job that exited 0 is SUCCEEDED (every job here exits 0 unless it was stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpuquota.adapters.event_store import EventStore
from gpuquota.core import replay
from gpuquota.node_agent import procs
from gpuquota.wire import events as ev
from gpuquota.wire.events import SchedulerEvent
from tests.e2e.conftest import G5, batch_client, log_events
from tests.gateway.helpers import create_queue, create_share
from tests.pipeline.services import ServiceProcess

JOB_SCRIPT = 'echo "$GPUQUOTA_ATTEMPT_ID" >> "$RUNS"; end=$SLEEP; while [ ! -e "$RELEASE" ]; do '
JOB_SCRIPT += 'if [ "$end" -le 0 ]; then exit 0; fi; sleep 0.05; end=$((end - 1)); done'


def job_payload(root: Path, ticks: int) -> str:
    """A job that runs for ``ticks`` x 0.05 s (or until ``root/release`` exists) and exits 0."""
    return json.dumps(
        {
            "AlgorithmSpecification": {"ContainerEntrypoint": ["/bin/sh", "-c", JOB_SCRIPT]},
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
            "Environment": {
                "RUNS": str(root / "runs"),
                "RELEASE": str(root / "release"),
                "SLEEP": str(ticks),
            },
        }
    )


@dataclass
class Figures:
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    requeued: int = 0
    """Attempts requeued (lost: their node did not run them, or lost with their node)."""
    recovery_seconds: list[float] = field(default_factory=list)

    def line(self, name: str) -> str:
        worst = max(self.recovery_seconds, default=0.0)
        return (
            f"FAULT {name}: acknowledged {self.acknowledged}, lost {self.lost}, "
            f"duplicated {self.duplicated}, stuck {self.stuck}, "
            f"recovery {worst:.1f} s (worst of {len(self.recovery_seconds)})"
        )


class Up:
    """``gpuquota up`` on ``data_dir`` as an OS process (embedded, or distributed with ``extra`` flags)."""

    def __init__(
        self, root: Path, nodes: str, extra: list[str] | None = None, env: dict[str, str] | None = None
    ):
        self.root = root
        self.nodes = nodes
        self.extra = extra or []
        self.env = {"GPUQUOTA_LOG_LEVEL": "INFO", **(env or {})}
        self.process: ServiceProcess | None = None
        self.url = ""
        self.starts = 0

    def make(self, nodes: str | None = None) -> ServiceProcess:
        args = ["--data-dir", str(self.root / "data"), "--port", "0", "--nodes", nodes or self.nodes]
        self.starts += 1
        return ServiceProcess("up", self.env, self.root / f"up-{self.starts}.log", [*args, *self.extra])

    async def start(self, nodes: str | None = None) -> float:
        """Starts it; the seconds until it was ready."""
        began = time.monotonic()
        self.process = self.make(nodes)
        await self.process.start(timeout=90)
        found = re.search(r"https?://\S+", self.process.ready_line)
        assert found, self.process.ready_line
        self.url = found.group(0)
        return time.monotonic() - began

    async def kill(self) -> None:
        assert self.process is not None
        self.url = ""  # its port is about to be free for any process to take (see ``Client``)
        await self.process.kill()

    async def stop(self) -> int:
        assert self.process is not None
        self.url = ""
        return await self.process.stop(timeout=60)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.root.glob("up-*.log")))


class Client:
    """Submits ``count`` jobs in a thread, each with its own clientToken, through crashes and restarts.

    ``url()`` is the stack's address, or "" while it is down: the port of a killed stack is free, and
    with ``--port 0`` any other process on the machine may bind it meanwhile (another test's fresh
    gateway, whose answer "Job queue jq does not exist" would be taken as our stack's refusal). A
    real client talks to one fixed endpoint; ours waits for the restarted stack's new one.
    """

    def __init__(self, url: Callable[[], str], root: Path, count: int, ticks: list[int]) -> None:
        self.url = url
        self.root = root
        self.count = count
        self.ticks = ticks
        self.acknowledged: dict[str, str] = {}
        """clientToken -> job id."""
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fault-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            for index in range(self.count):
                token = f"t{index}"
                payload = job_payload(self.root, self.ticks[index % len(self.ticks)])
                self.acknowledged[token] = self._submit(token, payload)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _submit(self, token: str, payload: str) -> str:
        deadline = time.monotonic() + 120
        while True:
            url = self.url()
            if not url:  # the stack is down: wait for its new address, never reuse the old one
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{token}: the stack did not come back within 120 s")
                time.sleep(0.1)  # polling interval
                continue
            try:
                batch = batch_client(url)
                try:
                    answer = batch.submit_service_job(
                        jobName=token,
                        jobQueue="jq",
                        serviceJobType="SAGEMAKER_TRAINING",
                        quotaShareName="QS",
                        serviceRequestPayload=payload,
                        clientToken=token,
                    )
                finally:
                    batch.close()
                return str(answer["jobId"])
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500) < 500:
                    raise  # a refusal, not a crash
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the stack failed while answering: retry with the same token
            except (BotoCoreError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the stack is down or restarting: retry with the same token

    async def wait(self, timeout: float) -> None:
        await asyncio.wait_for(asyncio.to_thread(self.done.wait), timeout)
        if self.error is not None:
            raise self.error


def setup_queue(url: str, capacity: int) -> None:
    batch = batch_client(url)
    try:
        create_queue(batch, capacity=capacity)
        create_share(batch, "QS", "LEND", limit=capacity)
    finally:
        batch.close()


def statuses(url: str, job_ids: list[str]) -> dict[str, str]:
    batch = batch_client(url)
    found: dict[str, str] = {}
    try:
        for job_id in job_ids:
            found[job_id] = str(batch.describe_service_job(jobId=job_id)["status"])
    finally:
        batch.close()
    return found


async def settle(url: str, job_ids: list[str], timeout: float, logs: Callable[[], str]) -> None:
    """Waits until every job is SUCCEEDED or FAILED (polls the gateway)."""
    pending = list(job_ids)
    deadline = time.monotonic() + timeout
    while pending:
        found = await asyncio.to_thread(statuses, url, pending[:200])
        pending = [j for j in pending if found.get(j, "") not in ("SUCCEEDED", "FAILED")]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} jobs not terminal, e.g. {pending[:3]}:\n{logs()}")
        await asyncio.sleep(0.5)  # polling interval


def runs(root: Path) -> Counter[str]:
    path = root / "runs"
    return Counter(path.read_text().split()) if path.exists() else Counter()


async def check(store: EventStore, pool: str, root: Path, acknowledged: dict[str, str]) -> Figures:
    """The assertions of the module doc, from the log; returns the figures."""
    events = await log_events(store, pool)
    return check_events(events, root, acknowledged)


def check_events(events: list[SchedulerEvent], root: Path, acknowledged: dict[str, str]) -> Figures:
    accepted = [e for e in events if isinstance(e, ev.JobAccepted)]
    per_token = Counter(e.job.client_token for e in accepted)
    terminal: Counter[str] = Counter()
    succeeded: set[str] = set()
    for e in events:
        if isinstance(e, ev.JobSucceeded | ev.JobFailed):
            terminal[e.job_id] += 1
        if isinstance(e, ev.JobSucceeded):
            succeeded.add(e.job_id)
    jobs = set(acknowledged.values())
    ran = runs(root)
    figures = Figures(
        acknowledged=len(jobs),
        lost=sum(1 for j in jobs if terminal[j] == 0),
        duplicated=sum(1 for t in acknowledged if per_token[t] != 1) + sum(1 for n in ran.values() if n > 1),
        stuck=0,
        requeued=sum(1 for e in events if isinstance(e, ev.JobRequeued)),
    )
    assert all(per_token[t] == 1 for t in acknowledged), "a clientToken made more than one job"
    assert all(terminal[j] == 1 for j in jobs), "a job did not reach exactly one terminal state"
    twice = [a for a, n in ran.items() if n > 1]
    assert not twice, f"attempts ran twice: {twice[:5]}"
    assert jobs <= succeeded, f"jobs that exited 0 are not SUCCEEDED: {sorted(jobs - succeeded)[:5]}"
    state = replay(events)
    holders = [j.job_id for j in state.jobs.values() if j.placements]
    figures.stuck = len(holders)
    assert not holders, f"jobs still hold capacity after settling: {holders[:5]}"
    for node in state.nodes.values():
        free = sum(len(f) for f in node.free.values())
        assert free == len(node.slots), f"node {node.node_id}: {free} of {len(node.slots)} slots free"
    return figures


def kill_leftovers(root: Path) -> None:
    """Kills the job processes a stopped stack left running (recorded in the agents' state.json)."""
    for state_file in root.glob("data/nodes/*/state.json"):
        with contextlib.suppress(OSError, ValueError):
            for record in (json.loads(state_file.read_text()).get("attempts") or {}).values():
                pgid: Any = record.get("pgid")
                if pgid and procs.group_alive(pgid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
