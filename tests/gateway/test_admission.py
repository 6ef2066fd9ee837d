"""Admission control (``gpuquota.gateway.admission``, issue #30): the bounds of the undecided backlog,
and the 429 ``TooManyRequestsException`` with ``Retry-After`` that boto3 retries with back-off.

The bound tests drive an ``Admission`` with a clock of their own; the HTTP tests use a real embedded
stack through unmodified boto3, its backlog filled by an input the test holds undecided (the
distributed mode's test, with the scheduler stopped, is tests/pipeline/test_admission.py)."""

from __future__ import annotations

import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from benchmarks.pipeline_workload import submission
from gpuquota.config.environ import SettingsError
from gpuquota.config.settings import ADMISSION_DEFAULTS, admission_from_env
from gpuquota.gateway.admission import FORGET_AFTER, Admission
from gpuquota.gateway.edge import token_job_id
from gpuquota.gateway.errors import TooManyRequests
from gpuquota.gateway.ports import EmbeddedCommandPort
from gpuquota.wire import inputs as inp
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import create_queue, create_share, payload


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def submit_job() -> inp.SubmitJob:
    return submission("admission", 0, 0)


def terminate_job() -> inp.TerminateJob:
    return inp.TerminateJob(event_id="terminate", occurred_at=0, job_id="admission-job-0")


def test_the_count_bound_refuses_submissions_only_and_frees_as_inputs_are_decided() -> None:
    admission = Admission(max_backlog=2, max_seconds=0)
    admission.admit(submit_job())
    admission.handed("a")
    admission.handed("b")
    with pytest.raises(TooManyRequests) as refused:
        admission.admit(submit_job())
    assert (refused.value.status, refused.value.code) == (429, "TooManyRequestsException")
    assert refused.value.headers["Retry-After"] in ("1", "2")  # at least 1 s, spread up to twice it
    assert "2 inputs undecided, at most 2" in refused.value.message
    admission.admit(terminate_job())  # getting out of an overload is never refused
    admission.decided("a")
    admission.admit(submit_job())
    assert admission.refused == 1


def test_the_age_bound_refuses_while_the_oldest_input_waits_too_long() -> None:
    clock = Clock()
    admission = Admission(max_backlog=0, max_seconds=5.0, clock=clock)
    admission.handed("old")
    clock.now += 4.0
    admission.handed("new")
    admission.admit(submit_job())
    clock.now += 3.5  # the oldest has waited 7.5 s
    with pytest.raises(TooManyRequests) as refused:
        admission.admit(submit_job())
    assert 3 <= int(refused.value.headers["Retry-After"]) <= 6  # how far over the bound, up to twice it
    assert "waited 7.5 s, at most 5" in refused.value.message
    admission.decided("old")  # the next one has waited 3.5 s
    admission.admit(submit_job())


def test_an_input_never_seen_decided_stops_counting_after_a_while() -> None:
    clock = Clock()
    admission = Admission(max_backlog=1, max_seconds=0, clock=clock)
    admission.handed("lost")
    with pytest.raises(TooManyRequests):
        admission.admit(submit_job())
    clock.now += FORGET_AFTER + 1
    admission.admit(submit_job())
    assert admission.backlog == 0


def test_retry_after_spreads_the_clients_refused_together() -> None:
    clock = Clock()
    admission = Admission(max_backlog=0, max_seconds=1.0, clock=clock, rng=random.Random(7))
    admission.handed("old")
    clock.now += 4.5  # 3.5 s over the bound: come back in 4 to 8 s
    answers = set()
    for _ in range(200):
        with pytest.raises(TooManyRequests) as refused:
            admission.check()
        answers.add(int(refused.value.headers["Retry-After"]))
    assert answers == set(range(4, 9))
    assert admission.refused == 200


def test_the_bounds_come_from_the_settings() -> None:
    bounds = admission_from_env(
        {"GPUQUOTA_ADMISSION_MAX_BACKLOG": "7", "GPUQUOTA_ADMISSION_MAX_SECONDS": "0.5"}
    )
    admission = Admission.of(bounds)
    assert (admission.max_backlog, admission.max_seconds) == (7, 0.5)
    default = Admission()
    assert (default.max_backlog, default.max_seconds) == (
        ADMISSION_DEFAULTS.admission_max_backlog,
        ADMISSION_DEFAULTS.admission_max_seconds,
    )
    with pytest.raises(SettingsError, match="GPUQUOTA_ADMISSION_MAX_SECONDS"):
        admission_from_env({"GPUQUOTA_ADMISSION_MAX_SECONDS": "-1"})


def test_no_bound_admits_everything() -> None:
    admission = Admission(max_backlog=0, max_seconds=0)
    for index in range(10_000):
        admission.handed(str(index))
    admission.admit(submit_job())


def retrying_client(url: str, mode: str, attempts: int = 8) -> Any:
    return boto3.client(
        "batch",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries={"mode": mode, "total_max_attempts": attempts}),
    )


@pytest.fixture
def stack() -> Any:
    made = StackThread()
    try:
        create_queue(made.client)
        create_share(made.client, "QS", "LEND")
        yield made
    finally:
        made.close()


def admission_of(stack: StackThread) -> Admission:
    port = stack.gateway.port
    assert isinstance(port, EmbeddedCommandPort)
    return port.admission


def submit(batch: Any, token: str) -> dict[str, Any]:
    answer: dict[str, Any] = batch.submit_service_job(
        jobName=token,
        jobQueue="jq",
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="QS",
        serviceRequestPayload=payload(),
        clientToken=token,
    )
    return answer


def test_a_full_backlog_answers_429_with_retry_after_and_records_nothing(stack: StackThread) -> None:
    admission = admission_of(stack)
    admission.max_backlog, admission.max_seconds = 1, 0
    admission.handed("held by the test")
    assert stack.gateway.admission is admission  # asked at the edge and by the port: one backlog
    once = boto3.client(
        "batch",
        endpoint_url=stack.url,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries={"total_max_attempts": 1}),
    )
    with pytest.raises(ClientError) as refused:
        submit(once, "t1")
    response = refused.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["Error"]["Code"] == "TooManyRequestsException"
    assert response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] in ("1", "2")
    with pytest.raises(ClientError, match="does not exist"):  # nothing was recorded
        once.describe_service_job(jobId=token_job_id("default", "t1"))
    assert admission.refused == 1


def post_not_json(url: str) -> urllib.error.HTTPError:
    request = urllib.request.Request(url, b"{not json", {"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(request, timeout=10)
    failed.value.close()
    return failed.value


def test_a_refusal_comes_before_the_body_is_read(stack: StackThread) -> None:
    """Over the bound a submission that is not even JSON is a 429, not a 400: the refusal parsed
    nothing (and within the bound the same request is the 400)."""
    admission = admission_of(stack)
    admission.max_backlog, admission.max_seconds = 1, 0
    admission.handed("held by the test")
    refused = post_not_json(f"{stack.url}/v1/submitservicejob")
    assert refused.code == 429, refused.read()
    assert refused.headers["x-amzn-ErrorType"] == "TooManyRequestsException"
    assert refused.headers["Retry-After"] in ("1", "2")
    admission.decided("held by the test")
    assert post_not_json(f"{stack.url}/v1/submitservicejob").code == 400
    assert admission.refused == 1


@pytest.mark.parametrize("mode", ["legacy", "standard"])
def test_boto3_retries_a_429_until_the_backlog_is_decided(stack: StackThread, mode: str) -> None:
    admission = admission_of(stack)
    admission.max_backlog, admission.max_seconds = 1, 0
    admission.handed("held by the test")
    batch = retrying_client(stack.url, mode)
    refusals: list[int] = []

    def release(response: Any = None, **_: Any) -> None:
        """The first 429 seen: decide the held input, so the retry is admitted."""
        if response is not None and response[0] is not None and response[0].status_code == 429:
            refusals.append(429)
            stack.run(_decided(admission))

    batch.meta.events.register("needs-retry.batch.SubmitServiceJob", release)
    answer = submit(batch, f"t-{mode}")
    assert refusals and answer["ResponseMetadata"]["RetryAttempts"] >= 1
    assert answer["jobId"] == token_job_id("default", f"t-{mode}")
    assert batch.describe_service_job(jobId=answer["jobId"])["status"] in ("SUBMITTED", "RUNNABLE")


async def _decided(admission: Admission) -> None:
    admission.decided("held by the test")


@pytest.mark.parametrize("mode", ["embedded", "distributed"])
def test_gpuquota_up_takes_the_bounds_from_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """``gpuquota up`` (both modes) reads GPUQUOTA_ADMISSION_* as ``gpuquota gateway`` does, and
    refuses a bad one before anything starts."""
    from gpuquota.entrypoints import embedded
    from gpuquota.entrypoints.cli import main

    served: list[embedded.Serving] = []

    def run_up(*args: Any) -> int:
        served.append(args[-1])  # the Serving, instead of starting anything
        return 0

    monkeypatch.setattr(embedded, "_run_up", run_up)
    if mode == "distributed":
        monkeypatch.setenv("GPUQUOTA_KAFKA", "127.0.0.1:1")
        monkeypatch.setenv("GPUQUOTA_DATABASE_URL", "postgresql://u:p@127.0.0.1:1/db")
    monkeypatch.setenv("GPUQUOTA_ADMISSION_MAX_BACKLOG", "7")
    monkeypatch.setenv("GPUQUOTA_ADMISSION_MAX_SECONDS", "0.5")
    assert main(["up", "--data-dir", str(tmp_path)]) == 0
    [up] = served
    assert (up.admission.max_backlog, up.admission.max_seconds) == (7, 0.5)
    monkeypatch.setenv("GPUQUOTA_ADMISSION_MAX_BACKLOG", "many")
    assert main(["up", "--data-dir", str(tmp_path)]) == 2
    assert len(served) == 1


def test_the_embedded_stack_refuses_with_the_bounds_it_is_given() -> None:
    made = StackThread(admission=Admission(max_backlog=1, max_seconds=0))
    try:
        create_queue(made.client)
        create_share(made.client, "QS", "LEND")
        assert made.gateway.admission is admission_of(made)
        admission_of(made).handed("held by the test")
        once = retrying_client(made.url, "standard", attempts=1)
        with pytest.raises(ClientError, match="TooManyRequestsException"):
            submit(once, "t1")
    finally:
        made.close()
