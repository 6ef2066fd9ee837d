"""Offered more submissions than it admits, the distributed gateway refuses them (issue #30: overload
is refused, not absorbed).

Real ``gpuquota scheduler`` and ``gpuquota node-agent`` processes over the real Kafka and PostgreSQL
(``conftest.Cluster``; the gateway in this process) with an admission bound of ``BOUND`` undecided
inputs. ``CLIENTS`` boto3 clients (standard retry mode, as a user's) submit ``JOBS`` short jobs (the
``faults`` jobs) as fast as they are answered, each with its clientToken: more submissions are in
flight at once than the bound admits, several times what the gateway lets through. Some must get
HTTP 429 ``TooManyRequestsException`` with ``Retry-After`` (botocore's ``needs-retry`` hook sees each
response); boto3 retries them with back-off and every one is acknowledged within ``SUBMIT_SECONDS``:
no hang, no error reaches a client. Then every acknowledged job reaches exactly one terminal state,
SUCCEEDED, each token made one job, no attempt ran twice and no capacity is held
(``faults.check_events`` on the log). Throughput under overload is the benchmark's (``benchmarks.pipeline
--overload 2``), never asserted here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.e2e.conftest import G5, ClusterFactory, apoll
from tests.e2e.faults import Figures, check_events, job_payload, settle, setup_queue

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLOTS = 4
BOUND = 2
CLIENTS = 12
JOBS = 240
SUBMIT_SECONDS = 180.0
"""Every submission is acknowledged within this, retries included (a hang fails the test)."""


class Throttles:
    """The 429 answers the clients saw, with their ``Retry-After``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.retry_after: list[str] = []
        self.codes: set[str] = set()

    def watch(self, batch: Any) -> None:
        def check(response: Any = None, **_: Any) -> None:
            if response is None or response[0] is None or response[0].status_code != 429:
                return
            with self.lock:
                self.retry_after.append(response[0].headers.get("Retry-After", ""))
                self.codes.add(str(response[1].get("Error", {}).get("Code")))

        batch.meta.events.register("needs-retry.batch.SubmitServiceJob", check)


def submit_all(url: str, tokens: list[str], payload: str, throttles: Throttles) -> dict[str, str]:
    """One client: submits ``tokens`` one after another; token -> job id."""
    retries = {"mode": "standard", "max_attempts": 50}
    batch = boto3.client(
        "batch",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries=retries, read_timeout=30),
    )
    throttles.watch(batch)
    acknowledged: dict[str, str] = {}
    try:
        for token in tokens:
            answer = batch.submit_service_job(
                jobName=token,
                jobQueue="jq",
                serviceJobType="SAGEMAKER_TRAINING",
                quotaShareName="QS",
                serviceRequestPayload=payload,
                clientToken=token,
            )
            acknowledged[token] = str(answer["jobId"])
    finally:
        batch.close()
    return acknowledged


async def test_an_overload_is_refused_with_429_and_every_acknowledged_job_runs_once(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await cluster_factory(2.0, grace=2.0)
    admission = cluster.gateway.admission  # GPUQUOTA_ADMISSION_MAX_BACKLOG / _SECONDS of a gateway
    admission.max_backlog, admission.max_seconds = BOUND, 0.0
    node = cluster.node_id("a")
    await cluster.agent(node, f"{G5}={SLOTS}").start()
    await apoll(lambda: cluster.online() == {node}, 30, "the node to register")
    url = cluster.gateway.url
    await asyncio.to_thread(setup_queue, url, SLOTS)
    payload = job_payload(tmp_path, ticks=1)  # 0.05 s each: the pool turns them over quickly
    throttles = Throttles()
    tokens = [[f"c{c}-{i}" for i in range(JOBS // CLIENTS)] for c in range(CLIENTS)]
    began = time.monotonic()
    answers = await asyncio.wait_for(
        asyncio.gather(*(asyncio.to_thread(submit_all, url, ts, payload, throttles) for ts in tokens)),
        SUBMIT_SECONDS,
    )
    submitted = time.monotonic() - began
    acknowledged = {token: job for answer in answers for token, job in answer.items()}
    assert len(acknowledged) == JOBS

    assert throttles.retry_after, "no submission was refused: the overload was absorbed"
    assert throttles.codes == {"TooManyRequestsException"}, throttles.codes
    assert all(value.isdigit() and int(value) >= 1 for value in throttles.retry_after), throttles.retry_after[
        :5
    ]
    assert admission.refused == len(throttles.retry_after)
    settled = time.monotonic()
    await settle(url, list(acknowledged.values()), 120, cluster.logs)
    drained = time.monotonic() - settled

    figures: Figures = check_events(await cluster.events(), tmp_path, acknowledged)
    figures.recovery_seconds = [drained]
    print(
        figures.line("overload of the distributed gateway")
        + f"; {len(throttles.retry_after)} answers were 429 (bound {BOUND}, {CLIENTS} clients);"
        + f" {JOBS} submitted in {submitted:.1f} s; all ended {drained:.1f} s after"
    )
