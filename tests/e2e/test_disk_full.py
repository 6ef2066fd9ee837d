"""``gpuquota up`` with its data directory on a small tmpfs that fills up and is freed (issue #30).

A real ``gpuquota up`` process (``faults.Up``, process runtime, the ``faults`` jobs) keeps its event
log and node work directories on a tmpfs this test mounts (root only: skipped elsewhere). Jobs run
and succeed; then a file fills the tmpfs to the last byte, and every submission (boto3, retries off)
must be answered within ``ANSWER_SECONDS`` with a 503 ``ServerException`` saying the event log cannot
be written because the disk is full; ``/health/ready`` names it; reads go on, and the process stays
up. Once the file is gone the same submissions (their clientTokens) and new ones are accepted and
run. After a restart from the log every acknowledged job is there exactly once, SUCCEEDED, and none
of the refused submissions that were never retried appears (``faults.check`` and the tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import pytest_asyncio
from botocore.config import Config
from botocore.exceptions import ClientError

from gpuquota.adapters.sqlite_store import STORE_FILE, SqliteEventStore
from gpuquota.wire import events as ev
from tests.e2e.conftest import log_events
from tests.e2e.faults import Figures, Up, check_events, job_payload, kill_leftovers, settle, setup_queue

pytestmark = pytest.mark.slow

SLOTS = 2
TMPFS_SIZE = "16m"
ANSWER_SECONDS = 5.0
"""A refused submission is answered within this (the client's deadline: far below boto3's 60 s)."""
REASON = "The event log cannot be written: database or disk is full"


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``path`` (created), unmounted at the end."""
    path.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root only): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(directory: Path) -> Path:
    """A file that takes every free byte of ``directory``'s file system (ENOSPC at its end)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"x" * chunk
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return filler


def client(url: str) -> Any:
    """boto3 with retries off: each call is one request, answered or not."""
    return boto3.client(
        "batch",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries={"max_attempts": 1}, read_timeout=30),
    )


def submit(url: str, token: str, payload: str) -> str:
    batch = client(url)
    try:
        answer = batch.submit_service_job(
            jobName=token,
            jobQueue="jq",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="QS",
            serviceRequestPayload=payload,
            clientToken=token,
        )
        return str(answer["jobId"])
    finally:
        batch.close()


def refused(url: str, token: str, payload: str) -> tuple[float, ClientError]:
    """The seconds it took to refuse the submission, and the error."""
    began = time.monotonic()
    with pytest.raises(ClientError) as raised:
        submit(url, token, payload)
    return time.monotonic() - began, raised.value


def ready(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{url}/health/ready", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest_asyncio.fixture
async def up(tmp_path: Path) -> AsyncIterator[Up]:
    with small_tmpfs(tmp_path / "data", TMPFS_SIZE):
        made = Up(tmp_path, f"ml.g5.xlarge={SLOTS}")
        try:
            yield made
        finally:
            if made.process is not None and made.process.alive:
                await made.stop()
            kill_leftovers(tmp_path)


async def test_a_full_disk_refuses_writes_promptly_and_serves_again_once_freed(up: Up) -> None:
    await up.start()
    url = up.url
    await asyncio.to_thread(setup_queue, url, SLOTS)
    payload = job_payload(up.root, ticks=2)  # 0.1 s each
    acknowledged: dict[str, str] = {}
    for index in range(4):
        token = f"before-{index}"
        acknowledged[token] = await asyncio.to_thread(submit, url, token, payload)
    await settle(url, list(acknowledged.values()), 60, up.logs)

    filler = fill(up.root / "data")
    answers = [await asyncio.to_thread(refused, url, f"refused-{i}", payload) for i in range(10)]
    for seconds, error in answers:
        assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 503, error.response
        assert error.response["Error"]["Code"] == "ServerException"
        assert REASON in error.response["Error"]["Message"], error.response["Error"]["Message"]
        assert seconds < ANSWER_SECONDS, f"refused after {seconds:.1f} s"
    status, body = await asyncio.to_thread(ready, url)
    assert status == 503 and "cannot be written" in body["checks"]["eventLog"], body

    batch = client(url)  # reads go on while writes are refused
    try:
        jobs = [batch.describe_service_job(jobId=job_id) for job_id in acknowledged.values()]
        assert {job["status"] for job in jobs} == {"SUCCEEDED"}
        listed = batch.list_service_jobs(jobQueue="jq", jobStatus="SUCCEEDED")["jobSummaryList"]
        assert {job["jobId"] for job in listed} == set(acknowledged.values())
    finally:
        batch.close()
    assert up.process is not None and up.process.alive

    filler.unlink()
    freed = time.monotonic()
    for index in range(5):  # the clients retry the refused half with their tokens; new ones come
        token = f"refused-{index}"
        acknowledged[token] = await asyncio.to_thread(submit, url, token, payload)
    served_again = time.monotonic() - freed
    for index in range(4):
        token = f"after-{index}"
        acknowledged[token] = await asyncio.to_thread(submit, url, token, payload)
    status, body = await asyncio.to_thread(ready, url)
    assert status == 200, body
    await settle(url, list(acknowledged.values()), 60, up.logs)

    assert await up.stop() == 0
    restarted = await up.start()
    found = await asyncio.to_thread(statuses_of, up.url, list(acknowledged.values()))
    assert set(found.values()) == {"SUCCEEDED"}, found
    assert await up.stop() == 0

    store = await SqliteEventStore.open(up.root / "data" / STORE_FILE)
    try:
        events = await log_events(store, "default")
    finally:
        await store.close()
    figures: Figures = check_events(events, up.root, acknowledged)
    tokens = {e.job.client_token for e in events if isinstance(e, ev.JobAccepted)}
    assert tokens == set(acknowledged), f"jobs of unacknowledged submissions: {tokens - set(acknowledged)}"
    figures.recovery_seconds = [served_again, restarted]
    slowest = max(seconds for seconds, _ in answers)
    print(
        figures.line("full disk of gpuquota up")
        + f"; {len(answers)} refused with 503 in at most {slowest:.3f} s; writes served again"
        + f" {served_again:.3f} s after freeing; restart ready in {restarted:.1f} s"
    )


def statuses_of(url: str, job_ids: list[str]) -> dict[str, str]:
    batch = client(url)
    try:
        return {job_id: str(batch.describe_service_job(jobId=job_id)["status"]) for job_id in job_ids}
    finally:
        batch.close()
