"""Admission control of the distributed gateway (issue #30): with the scheduler stopped nothing is
decided, so once ``GPUQUOTA_ADMISSION_MAX_BACKLOG`` inputs wait, a submission is refused with HTTP 429
``TooManyRequestsException`` and ``Retry-After`` before anything is produced; boto3 retries it with
back-off and it succeeds once the scheduler runs again. Real ``gpuquota gateway`` and ``gpuquota
scheduler`` processes over the test Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from gpuquota.gateway.edge import token_job_id
from tests.e2e.faults import setup_queue
from tests.gateway.helpers import G5
from tests.pipeline.conftest import wait_until
from tests.pipeline.services import Services, free_port

pytestmark = pytest.mark.integration

BOUND = 3
PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}})


def client(url: str, retries: dict[str, Any]) -> Any:
    """A boto3 Batch client of the gateway with the retry configuration ``retries``."""
    return boto3.client(
        "batch",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries=retries, read_timeout=30),
    )


def throttled(batch: Any) -> threading.Event:
    """Set once ``batch`` has received a 429 (botocore's ``needs-retry`` hook sees each response)."""
    seen = threading.Event()

    def check(response: Any = None, **_: Any) -> None:
        if response is not None and response[0] is not None and response[0].status_code == 429:
            seen.set()

    batch.meta.events.register("needs-retry.batch.SubmitServiceJob", check)
    return seen


def submit(batch: Any, token: str) -> dict[str, Any]:
    answer: dict[str, Any] = batch.submit_service_job(
        jobName=token,
        jobQueue="jq",
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="QS",
        serviceRequestPayload=PAYLOAD,
        clientToken=token,
    )
    return answer


async def test_a_full_backlog_refuses_submissions_with_429_until_the_scheduler_decides(
    services: Services, pool: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scheduler = services.scheduler()
    gateway = services.gateway(
        port, GPUQUOTA_ADMISSION_MAX_BACKLOG=str(BOUND), GPUQUOTA_ADMISSION_MAX_SECONDS="0"
    )
    await scheduler.start()
    await gateway.start()
    await asyncio.to_thread(setup_queue, url, 3)
    assert await scheduler.stop() == 0  # from now on nothing is decided

    once = client(url, {"total_max_attempts": 1})
    # each waits its decision timeout (5 s) and is accepted undecided: the input is in Kafka
    taken = await asyncio.gather(*(asyncio.to_thread(submit, once, f"a{i}") for i in range(BOUND)))
    assert [answer["jobId"] for answer in taken] == [token_job_id(pool, f"a{i}") for i in range(BOUND)]

    began = time.monotonic()
    with pytest.raises(ClientError) as refused:
        await asyncio.to_thread(submit, once, "b0")
    answered = time.monotonic() - began
    response = refused.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["Error"]["Code"] == "TooManyRequestsException"
    assert "3 inputs undecided" in response["Error"]["Message"], response["Error"]
    assert int(response["ResponseMetadata"]["HTTPHeaders"]["retry-after"]) >= 1
    assert answered < 1.0, f"a refusal must be immediate, took {answered:.2f} s"
    with pytest.raises(ClientError, match="does not exist"):  # nothing was recorded
        once.describe_service_job(jobId=token_job_id(pool, "b0"))

    # both of boto3's retry modes take the 429 as throttling and retry it with back-off
    patient = {mode: client(url, {"mode": mode, "max_attempts": 12}) for mode in ("standard", "legacy")}
    refusals = [throttled(batch) for batch in patient.values()]
    retried = [asyncio.to_thread(submit, batch, f"c-{mode}") for mode, batch in patient.items()]
    waiting = asyncio.gather(*retried)
    for seen in refusals:
        await asyncio.wait_for(asyncio.to_thread(seen.wait), 30)
    await services.scheduler().start()  # decides the backlog: the retries get through
    answers = await asyncio.wait_for(waiting, 120)
    for answer, mode in zip(answers, patient, strict=True):
        assert answer["jobId"] == token_job_id(pool, f"c-{mode}")
        assert answer["ResponseMetadata"]["RetryAttempts"] >= 1, answer["ResponseMetadata"]

    def described() -> set[str]:
        return {once.describe_service_job(jobId=job)["status"] for job in expected}

    expected = [token_job_id(pool, token) for token in ("a0", "a1", "a2", "c-standard", "c-legacy")]

    async def all_decided() -> bool:
        return "SUBMITTED" not in await asyncio.to_thread(described)

    await wait_until(all_decided, 60, "the three undecided and the two retried jobs to be decided")
