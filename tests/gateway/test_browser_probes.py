"""Probes of issue #27 against a real ``gpuquota up`` (process runtime, default settings): what a web page
the user visits could send, refused; what the console, boto3 and the AWS CLI send, working.

Each refused submission's command would create a marker file. "Nothing ran" is checked after a later,
allowed job whose own command writes its marker has SUCCEEDED on the same nodes: the refused ones had
every chance to run first. "No job created": ListServiceJobs knows no job of the refused names.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuquota.gateway.browser_guard import CONSOLE_CSP, CONSOLE_TOKEN_HEADER
from tests.gateway.conftest import wait_for
from tests.gateway.helpers import G5, create_queue, create_share, submit
from tests.pipeline.services import ServiceProcess, batch_client, free_port

EVIL = "http://evil.example"
JSON = {"Content-Type": "application/json"}


@dataclass
class Up:
    url: str
    port: int
    root: Path
    batch: Any

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def send(
        self, method: str, path: str, headers: Mapping[str, str] | None = None, body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One raw request (``Host`` the gateway's unless ``headers`` name another)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers={"Host": self.host, **(headers or {})})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def job_names(self, *names: str) -> set[str]:
        """Which of ``names`` name a job, whatever its status (the JOB_NAME filter lists them all)."""
        filters = [{"name": "JOB_NAME", "values": list(names)}]
        listed = self.batch.list_service_jobs(jobQueue="jq", filters=filters)["jobSummaryList"]
        return {job["jobName"] for job in listed}

    def marker(self, name: str) -> Path:
        return self.root / f"{name}.ran"

    def submit_body(self, name: str) -> bytes:
        """A SubmitServiceJob request whose command creates ``marker(name)``."""
        payload = {
            "AlgorithmSpecification": {"ContainerEntrypoint": ["/bin/sh", "-c", 'touch "$MARKER"']},
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
            "Environment": {"MARKER": str(self.marker(name))},
        }
        body = {
            "jobName": name,
            "jobQueue": "jq",
            "serviceJobType": "SAGEMAKER_TRAINING",
            "quotaShareName": "QS1",
            "serviceRequestPayload": json.dumps(payload),
        }
        return json.dumps(body).encode()

    def run_allowed_job(self, name: str) -> None:
        """Submit through boto3 a job that creates its marker; return once it SUCCEEDED and did."""
        body = json.loads(self.submit_body(name))
        job = self.batch.submit_service_job(**body)["jobId"]
        wait_for(lambda: self.batch.describe_service_job(jobId=job)["status"] == "SUCCEEDED", timeout=60)
        assert self.marker(name).exists()

    def console_token(self) -> str:
        status, _, page = self.send("GET", "/console/")
        assert status == 200
        found = re.search(rb'<meta name="gpuquota-console-token" content="([^"]+)">', page)
        assert found is not None, page
        return found.group(1).decode()


@pytest.fixture(scope="module")
async def up(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Up]:
    root = tmp_path_factory.mktemp("probes")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    args = [
        "--data-dir",
        str(root / "data"),
        "--port",
        str(port),
        "--nodes",
        f"{G5}=2",
        "--runtime",
        "process",
    ]
    process = ServiceProcess("up", env, root / "up.log", args)
    process.env = env  # exactly the defaults: no GPUQUOTA_* variable of this machine
    await process.start()
    try:
        url = process.ready_line.rsplit(" ", 1)[1]
        assert url == f"http://127.0.0.1:{port}", process.ready_line
        batch = batch_client(url)
        create_queue(batch, capacity=2)
        create_share(batch, "QS1", "LEND_AND_BORROW", limit=2)
        yield Up(url, port, root, batch)
    finally:
        assert await process.stop() == 0, process.tail()


# ----- what a page could send: refused ------------------------------------------------------------


def test_cross_origin_submits_are_refused_and_nothing_runs(up: Up) -> None:
    """A page's no-cors ``text/plain`` POST, the same without ``Origin``, and a cross-origin JSON one."""
    refused = {
        "text-plain-cross-origin": ({"Content-Type": "text/plain", "Origin": EVIL}, 403),
        "text-plain-no-origin": ({"Content-Type": "text/plain;charset=UTF-8"}, 415),
        "json-cross-origin": ({**JSON, "Origin": EVIL}, 403),
        "form-no-origin": ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    }
    for name, (headers, expected) in refused.items():
        status, answer, body = up.send("POST", "/v1/submitservicejob", headers, up.submit_body(name))
        assert status == expected, (name, status, body)
        error = {403: "AccessDeniedException", 415: "UnsupportedMediaTypeException"}[expected]
        assert answer["x-amzn-ErrorType"] == error and "message" in json.loads(body)
    up.run_allowed_job("allowed-after-refused")  # what was refused had every chance to run before it
    assert up.job_names(*refused, "allowed-after-refused") == {"allowed-after-refused"}
    assert [name for name in refused if up.marker(name).exists()] == []


def test_a_rebinding_host_is_misdirected(up: Up) -> None:
    rebound = {"Host": f"evil.example:{up.port}"}
    probes = [
        ("POST", "/v1/submitservicejob", {**rebound, **JSON}, up.submit_body("rebound")),
        ("POST", "/v1/listservicejobs", {**rebound, **JSON}, b'{"jobQueue": "jq"}'),
        ("GET", "/console/", rebound, None),
        ("GET", "/console/api/overview", rebound, None),
        ("GET", "/console/api/jobs", rebound, None),
        ("GET", "/gpuquota/v1/shares", rebound, None),
        ("GET", "/metrics", rebound, None),
    ]
    for method, path, headers, body in probes:
        status, answer, text = up.send(method, path, headers, body)
        assert status == 421, (path, status, text)
        assert answer["x-amzn-ErrorType"] == "MisdirectedRequestException"
        assert b"jobs" not in text and b"gpuquota-console-token" not in text  # nothing read
    up.run_allowed_job("allowed-after-rebound")
    assert up.job_names("rebound", "allowed-after-rebound") == {"allowed-after-rebound"}
    assert not up.marker("rebound").exists()


def test_console_changes_without_the_token_are_refused(up: Up) -> None:
    job = submit(up.batch, "console-target", "QS1", 1, serviceRequestPayload=_sleeping())
    path = f"/console/api/jobs/{urllib.parse.quote(job)}/priority"
    own = f"http://{up.host}"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    probes = [
        ({**form, "Origin": EVIL}, b"priority=9", 403),  # a cross-site <form method=post>
        ({**form, "Origin": own}, b"priority=9", 415),  # the same form, were it served by the gateway
        (form, b"priority=9", 415),
        ({**JSON, "Origin": own}, b'{"priority": 9}', 403),  # JSON without the token
        ({**JSON, CONSOLE_TOKEN_HEADER: "guessed"}, b'{"priority": 9}', 403),
    ]
    for headers, body, expected in probes:
        status, _, text = up.send("POST", path, headers, body)
        assert status == expected, (headers, status, text)
        status, _, text = up.send("POST", path.replace("/priority", "/terminate"), headers, b"{}")
        assert status in (403, 415), (headers, status, text)
    described = up.batch.describe_service_job(jobId=job)
    assert described["schedulingPriority"] == 1 and described["status"] not in ("FAILED", "SUCCEEDED")
    up.batch.terminate_service_job(jobId=job, reason="probe done")  # its slot, for the next probes


def test_the_consoles_own_changes_work(up: Up) -> None:
    job = submit(up.batch, "console-own", "QS1", 1, serviceRequestPayload=_sleeping())
    token = up.console_token()
    headers = {**JSON, "Origin": f"http://{up.host}", CONSOLE_TOKEN_HEADER: token}
    path = f"/console/api/jobs/{urllib.parse.quote(job)}"
    status, _, text = up.send("POST", path + "/priority", headers, b'{"priority": 7}')
    assert status == 200, text
    assert up.batch.describe_service_job(jobId=job)["schedulingPriority"] == 7
    status, _, text = up.send("POST", path + "/terminate", headers, b'{"reason": "probe"}')
    assert status == 200, text
    wait_for(lambda: up.batch.describe_service_job(jobId=job)["status"] == "FAILED", timeout=60)


def test_console_pages_have_the_security_headers(up: Up) -> None:
    status, headers, _ = up.send("GET", "/console/")
    assert status == 200
    assert headers["Content-Security-Policy"] == CONSOLE_CSP
    assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer"
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"
    _, api, _ = up.send("POST", "/v1/listservicejobs", JSON, b'{"jobQueue": "jq"}')
    assert api["X-Content-Type-Options"] == "nosniff" and api["X-Frame-Options"] == "DENY"


# ----- what the AWS clients send: unchanged -------------------------------------------------------


def test_boto3_works_unchanged(up: Up) -> None:
    """Every kind of request botocore sends: JSON POSTs, bodiless GET and DELETE (tags)."""
    batch = up.batch
    arn = batch.describe_job_queues(jobQueues=["jq"])["jobQueues"][0]["jobQueueArn"]
    batch.tag_resource(resourceArn=arn, tags={"team": "probe"})
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"team": "probe"}
    batch.untag_resource(resourceArn=arn, tagKeys=["team"])
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {}
    assert batch.list_scheduling_policies()["schedulingPolicies"]
    assert batch.get_job_queue_snapshot(jobQueue="jq")
    job = submit(batch, "boto3-job", "QS1", 1, serviceRequestPayload=_sleeping())
    batch.update_service_job(jobId=job, schedulingPriority=5)
    assert batch.describe_service_job(jobId=job)["schedulingPriority"] == 5
    batch.terminate_service_job(jobId=job, reason="probe")
    wait_for(lambda: batch.describe_service_job(jobId=job)["status"] == "FAILED", timeout=60)


def test_the_gpuquota_cli_works_unchanged(up: Up) -> None:
    """``gpuquota nodes drain`` POSTs without a body (now as JSON); ``gpuquota shares`` GETs."""
    env = {**os.environ, "GPUQUOTA_ENDPOINT": up.url}
    for command in (["nodes", "drain", "local-1"], ["nodes", "undrain", "local-1"], ["shares"]):
        done = subprocess.run(
            [sys.executable, "-m", "gpuquota", *command],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)


def test_the_aws_cli_works_unchanged(up: Up) -> None:
    # the test extra installs awscli beside this interpreter: a missing CLI fails, it does not skip
    aws = str(Path(sys.executable).with_name("aws"))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_DEFAULT_REGION": "us-east-1",
    }

    def cli(*args: str) -> dict[str, Any]:
        done = subprocess.run(
            [aws, "batch", *args, "--endpoint-url", up.url, "--output", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (args, done.stderr)
        return json.loads(done.stdout or "{}")  # type: ignore[no-any-return]

    arn = cli("describe-job-queues", "--job-queues", "jq")["jobQueues"][0]["jobQueueArn"]
    cli("tag-resource", "--resource-arn", arn, "--tags", "via=aws-cli")
    assert cli("list-tags-for-resource", "--resource-arn", arn)["tags"] == {"via": "aws-cli"}
    cli("untag-resource", "--resource-arn", arn, "--tag-keys", "via")
    body = json.loads(up.submit_body("aws-cli-job"))
    job = cli(
        "submit-service-job",
        "--job-name", body["jobName"], "--job-queue", "jq", "--service-job-type", "SAGEMAKER_TRAINING",
        "--quota-share-name", "QS1", "--service-request-payload", body["serviceRequestPayload"],
    )["jobId"]  # fmt: skip
    wait_for(lambda: cli("describe-service-job", "--job-id", job)["status"] == "SUCCEEDED", timeout=60)
    assert up.marker("aws-cli-job").exists()
    filters = json.dumps([{"name": "JOB_NAME", "values": ["aws-cli-job"]}])
    listed = cli("list-service-jobs", "--job-queue", "jq", "--filters", filters)["jobSummaryList"]
    assert [j["jobId"] for j in listed] == [job]


def _sleeping() -> str:
    """A job that runs until terminated (so that its priority and termination can be seen)."""
    payload = {
        "AlgorithmSpecification": {"ContainerEntrypoint": ["/bin/sh", "-c", "sleep 600"]},
        "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
    }
    return json.dumps(payload)
