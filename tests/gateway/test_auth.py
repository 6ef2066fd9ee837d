"""SigV4 authentication and share-limited keys (I2), with boto3 signing real requests."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from gpuquota.gateway.auth import (
    AuthError,
    KeyConfigError,
    Keyring,
    SignedRequest,
    verify,
)
from tests.gateway.conftest import Stack, start_stack
from tests.gateway.helpers import QUEUE_ARN, payload, share_arn, submit, worked_example

KEYS: list[dict[str, Any]] = [
    {"access_key": "ADMIN", "secret_key": "admin-secret", "admin": True},
    {"access_key": "TEAM1", "secret_key": "team1-secret", "quota_shares": ["jq/QS1"]},
    {"access_key": "TEAM2", "secret_key": "team2-secret", "quota_shares": ["jq/QS2", "other/QS1"]},
]
NO_RETRY = Config(retries={"max_attempts": 1, "mode": "standard"})


@pytest.fixture(scope="module")
def secured(mode: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    s = start_stack(mode, request, auth=Keyring.from_data(KEYS))
    s.client.close()
    s.client = client(s, "ADMIN", "admin-secret")
    try:
        worked_example(s.client)
        yield s
    finally:
        s.close()


def client(stack: Stack, key: str, secret: str, **config: Any) -> Any:
    return boto3.client(
        "batch",
        endpoint_url=stack.url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=NO_RETRY.merge(Config(**config)),
    )


def denied(call: Any, code: str = "AccessDeniedException") -> str:
    with pytest.raises(ClientError) as info:
        call()
    error = info.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403, error
    assert error["Error"]["Code"] == code, error
    return str(error["Error"]["Message"])


# ----- end to end through boto3 ------------------------------------------------------------------


def test_admin_key_may_do_everything(secured: Stack) -> None:
    admin = secured.client
    assert [s["quotaShareName"] for s in admin.list_quota_shares(jobQueue="jq")["quotaShares"]] == [
        "QS1",
        "QS2",
        "QS3",
    ]
    job_id = submit(admin, "admin-job", share="QS3")
    assert admin.describe_service_job(jobId=job_id)["quotaShareName"] == "QS3"
    # the path carries a percent-encoded ARN, the query a list: both are part of what is signed
    admin.tag_resource(resourceArn=QUEUE_ARN, tags={"team": "ml", "cost center": "a/b"})
    admin.untag_resource(resourceArn=QUEUE_ARN, tagKeys=["cost center", "nothing"])
    assert admin.list_tags_for_resource(resourceArn=QUEUE_ARN)["tags"] == {"team": "ml"}
    admin.terminate_service_job(jobId=job_id, reason="done")


def test_wrong_secret_unknown_key_and_missing_signature_are_refused(secured: Stack) -> None:
    wrong = client(secured, "ADMIN", "not-the-secret")
    message = denied(lambda: wrong.list_quota_shares(jobQueue="jq"), "InvalidSignatureException")
    assert "signature" in message
    unknown = client(secured, "NOBODY", "admin-secret")
    denied(lambda: unknown.list_quota_shares(jobQueue="jq"), "UnrecognizedClientException")
    unsigned = client(secured, "ADMIN", "admin-secret", signature_version=UNSIGNED)
    denied(lambda: unsigned.list_quota_shares(jobQueue="jq"), "MissingAuthenticationTokenException")
    for c in (wrong, unknown, unsigned):
        c.close()


def test_health_and_raw_requests(secured: Stack) -> None:
    with urllib.request.urlopen(secured.stack.url + "/health", timeout=10) as response:
        assert response.status == 200
    for path in ("/v1/listquotashares", "/v1/nosuchoperation", "/gpuquota/v1/shares"):
        request = urllib.request.Request(
            secured.stack.url + path, data=b"{}", method="POST", headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 403
        assert info.value.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
        assert "message" in json.loads(info.value.read())
        info.value.close()


def test_share_limited_key(secured: Stack) -> None:
    admin = secured.client
    team1 = client(secured, "TEAM1", "team1-secret")
    team2 = client(secured, "TEAM2", "team2-secret")
    try:
        own = submit(team1, "team1-job", share="QS1", priority=2)
        assert team1.describe_service_job(jobId=own)["quotaShareName"] == "QS1"
        arn = f"arn:aws:batch:us-east-1:000000000000:service-job/{own}"
        assert team1.update_service_job(jobId=arn, schedulingPriority=5)["jobArn"] == arn
        other = submit(team2, "team2-job", share="QS2")

        # another share's job: submit, describe, update, terminate (one or many) are denied
        message = denied(lambda: submit(team1, "sneaky", share="QS2"))
        assert "TEAM1" in message and "batch:SubmitServiceJob" in message
        denied(lambda: team1.submit_service_job(
            jobName="arn-queue", jobQueue=QUEUE_ARN, serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="QS3", serviceRequestPayload=payload(),
        ))  # fmt: skip
        denied(lambda: team1.describe_service_job(jobId=other))
        denied(lambda: team1.update_service_job(jobId=other, schedulingPriority=9))
        denied(lambda: team1.terminate_service_job(jobId=other, reason="mine now"))
        denied(lambda: team1.terminate_service_jobs(jobs=[own, other], reason="all"))
        assert admin.describe_service_job(jobId=other)["isTerminated"] is False

        # everything but the job operations is denied
        denied(lambda: team1.list_quota_shares(jobQueue="jq"))
        denied(lambda: team1.describe_quota_share(quotaShareArn=share_arn("QS1")))
        denied(lambda: team1.create_scheduling_policy(name="p2", quotaSharePolicy={
            "idleResourceAssignmentStrategy": "FIFO"
        }))  # fmt: skip
        denied(lambda: team1.get_job_queue_snapshot(jobQueue="jq"))
        denied(lambda: team1.list_tags_for_resource(resourceArn=arn))

        # lists show only the key's shares; the admin sees everything
        def names(c: Any, **kwargs: Any) -> set[str]:
            jobs = c.list_service_jobs(jobQueue="jq", **kwargs)["jobSummaryList"]
            return {j["jobName"] for j in jobs}

        everything = {"filters": [{"name": "JOB_NAME", "values": ["team*"]}]}
        assert names(team1, **everything) == {"team1-job"}
        assert names(team2, **everything) == {"team2-job"}
        assert names(admin, **everything) == {"team1-job", "team2-job"}
        assert names(team1, filters=[{"name": "QUOTA_SHARE_NAME", "values": ["QS2"]}]) == set()

        # an unknown job id is the operation's own error, not a denial
        with pytest.raises(ClientError) as info:
            team1.describe_service_job(jobId="no-such-job")
        assert info.value.response["Error"]["Code"] == "ClientException"

        assert team1.terminate_service_jobs(jobs=[own], reason="done")["successful"] == [own]
        team2.terminate_service_job(jobId=other, reason="done")
    finally:
        team1.close()
        team2.close()


# ----- the verifier against botocore's signer ----------------------------------------------------

KEYRING = Keyring.from_data(KEYS)


def signed(
    method: str = "POST",
    url: str = "http://127.0.0.1:8642/v1/listservicejobs",
    body: bytes = b'{"jobQueue": "jq"}',
    secret: str = "team1-secret",
    extra: dict[str, str] | None = None,
) -> SignedRequest:
    request = AWSRequest(method=method, url=url, data=body, headers=extra or {})
    SigV4Auth(Credentials("TEAM1", secret), "batch", "eu-west-1").add_auth(request)
    request.prepare()
    path, _, query = url.split("127.0.0.1:8642", 1)[1].partition("?")
    headers = {"host": ["127.0.0.1:8642"]}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    return SignedRequest(method, path, query, headers, body)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def test_verify_accepts_what_botocore_signs() -> None:
    assert verify(signed(), KEYRING, now()).access_key == "TEAM1"
    tagged = "http://127.0.0.1:8642/v1/tags/arn%3Aaws%3Abatch%3Aus-east-1%3A000000000000%3Ajob-queue%2Fjq"
    assert verify(signed("DELETE", tagged + "?tagKeys=b&tagKeys=a%20b&x=", b""), KEYRING, now())
    body_hash = hashlib.sha256(b"{}").hexdigest()
    assert verify(signed(body=b"{}", extra={"X-Amz-Content-SHA256": body_hash}), KEYRING, now())


def _replace(**change: Any) -> Any:
    return lambda request: dataclasses.replace(request, **change)


def _headers(name: str, value: str | None) -> Any:
    def change(request: SignedRequest) -> SignedRequest:
        headers = {k: v for k, v in request.headers.items() if k != name}
        if value is not None:
            headers[name] = [value]
        return dataclasses.replace(request, headers=headers)

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_replace(body=b'{"jobQueue": "x"}'), "does not match"),
        (_replace(method="PUT"), "does not match"),
        (_replace(raw_path="/v1/describeservicejob"), "does not match"),
        (_replace(raw_query="a=1"), "does not match"),
        (_headers("host", "evil:1"), "does not match"),
        (_headers("x-amz-date", None), "missing from the request: x-amz-date"),
        (_headers("authorization", None), "Missing Authentication Token"),
    ],
)
def test_verify_refuses_tampering(change: Any, message: str) -> None:
    with pytest.raises(AuthError, match=message):
        verify(change(signed()), KEYRING, now())


def test_verify_checks_clock_skew_scope_and_payload_hash() -> None:
    request = signed()
    verify(request, KEYRING, now() + dt.timedelta(minutes=14))
    verify(request, KEYRING, now() - dt.timedelta(minutes=14))
    with pytest.raises(AuthError, match="Signature expired"):
        verify(request, KEYRING, now() + dt.timedelta(minutes=16))
    with pytest.raises(AuthError, match="Signature expired"):
        verify(request, KEYRING, now() - dt.timedelta(minutes=16))
    with pytest.raises(AuthError, match="x-amz-content-sha256"):
        verify(signed(extra={"X-Amz-Content-SHA256": "0" * 64}), KEYRING, now())
    with pytest.raises(AuthError, match="match"):
        verify(signed(secret="wrong"), KEYRING, now())
    auth = request.headers["authorization"][0].replace("/batch/", "/s3/")
    with pytest.raises(AuthError, match="service"):
        verify(
            dataclasses.replace(request, headers={**request.headers, "authorization": [auth]}), KEYRING, now()
        )


# ----- the keys file -----------------------------------------------------------------------------


def test_keys_file_yaml_json_and_errors(tmp_path: Path) -> None:
    yml = tmp_path / "keys.yaml"
    yml.write_text(
        "keys:\n  - {access_key: A, secret_key: s, admin: true}\n"
        "  - access_key: B\n    secret_key: t\n    quota_shares: [jq/QS1]\n"
    )
    ring = Keyring.load(yml)
    assert ring.keys["A"].principal.admin and ring.keys["B"].principal.shares == {("jq", "QS1")}
    js = tmp_path / "keys.json"
    js.write_text(json.dumps(KEYS))
    assert len(Keyring.load(js)) == 3

    bad = [
        ([{"access_key": "A", "secret_key": "s", "quota_shares": ["QS1"]}], "QUEUE/SHARE"),
        ([{"access_key": "A", "secret_key": "s"}] * 2, "twice"),
        ([{"access_key": "A"}], "secret_key"),
        ([{"access_key": "A", "secret_key": "s", "role": "x"}], "role"),
        ([], "non-empty"),
    ]
    for data, message in bad:
        with pytest.raises(KeyConfigError, match=message):
            Keyring.from_data(data)
    with pytest.raises(KeyConfigError, match="cannot read"):
        Keyring.load(tmp_path / "missing.yaml")


def test_up_and_gateway_refuse_a_bad_keys_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuquota.entrypoints.cli import main

    assert main(["up", "--data-dir", str(tmp_path), "--auth-keys", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read auth keys file" in capsys.readouterr().err
    monkeypatch.setenv("GPUQUOTA_KAFKA", "127.0.0.1:1")
    monkeypatch.setenv("GPUQUOTA_DATABASE_URL", "postgresql://u:p@127.0.0.1:1/db")
    monkeypatch.setenv("GPUQUOTA_AUTH_KEYS", str(tmp_path / "env.yaml"))
    assert main(["gateway"]) == 2
    assert "env.yaml" in capsys.readouterr().err
    assert main(["gateway", "--auth-keys", str(tmp_path / "flag.yaml")]) == 2
    assert "flag.yaml" in capsys.readouterr().err


def test_cli_signs_with_the_environments_key(
    secured: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuquota.entrypoints.cli import main

    job_id = submit(secured.client, "cli-job", share="QS1")
    url = secured.stack.url

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        rc = main([*argv, "--endpoint", url])
        captured = capsys.readouterr()
        return rc, captured.out + captured.err

    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    rc, out = run("shares")
    assert rc == 1 and "security token" in out  # the CLI's default key is not configured
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ADMIN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "admin-secret")
    for argv in (("shares",), ("explain", job_id), ("jobs", "describe", job_id)):
        rc, out = run(*argv)
        assert rc == 0, out
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "TEAM2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "team2-secret")
    rc, out = run("explain", job_id)
    assert rc == 1 and "not authorized" in out
    secured.client.terminate_service_job(jobId=job_id, reason="done")


def test_cli_node_and_log_commands_are_signed_and_authorized(
    secured: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gpuquota nodes`` (and drain, a signed POST) need an administrator; ``jobs logs`` a key of the
    job's share."""
    from gpuquota.entrypoints.cli import main

    job_id = submit(secured.client, "logs-job", share="QS1")

    def run(key: str, secret: str, *argv: str) -> tuple[int, str]:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        capsys.readouterr()
        rc = main(["--endpoint", secured.stack.url, *argv])
        captured = capsys.readouterr()
        return rc, captured.out + captured.err

    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert run("ADMIN", "admin-secret", "nodes", "-o", "json")[0] == 0
    assert run("ADMIN", "admin-secret", "nodes", "drain", "nope") == (
        1,
        "gpuquota nodes: Node nope is not registered\n",
    )
    rc, out = run("ADMIN", "admin-secret", "jobs", "logs", job_id)
    assert rc == 1 and "has no attempt yet (status RUNNABLE)" in out
    for argv, action in (
        (("nodes",), "gpuquota:ListNodes"),
        (("nodes", "undrain", "nope"), "gpuquota:UndrainNode"),
        (("jobs", "logs", job_id), "gpuquota:GetJobLogs"),
    ):
        rc, out = run("TEAM2", "team2-secret", *argv)
        assert rc == 1 and f"not authorized to perform: {action}" in out, out
    secured.client.terminate_service_job(jobId=job_id, reason="done")
