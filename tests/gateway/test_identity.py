"""STS ``GetCallerIdentity`` and IAM ``GetRole`` for the SageMaker SDK (issue #31), through unmodified
boto3 pointed at the gateway with ``endpoint_url`` (as ``AWS_ENDPOINT_URL_STS``/``_IAM`` do), and the
SDK's own role resolution; the browser guard's rules on the form-encoded query route."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from gpuquota.gateway.auth import Keyring
from tests.gateway.conftest import Stack

KEYS = [
    {"access_key": "ADMIN", "secret_key": "admin-secret", "admin": True},
    {"access_key": "TEAM1", "secret_key": "team1-secret", "quota_shares": ["jq/QS1"]},
]
NO_RETRY = Config(retries={"max_attempts": 1, "mode": "standard"})
FORM = "application/x-www-form-urlencoded; charset=utf-8"
IDENTITY_BODY = b"Action=GetCallerIdentity&Version=2011-06-15"


def aws(service: str, stack: Stack, key: str = "x", secret: str = "y") -> Any:
    return boto3.client(
        service,
        endpoint_url=stack.url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=NO_RETRY,
    )


def error_code(call: Callable[[], Any]) -> str:
    with pytest.raises(ClientError) as info:
        call()
    return str(info.value.response["Error"]["Code"])


def test_local_identity_without_authentication(stack: Stack) -> None:
    identity = aws("sts", stack).get_caller_identity()
    assert identity["Account"] == "000000000000"
    assert identity["Arn"] == "arn:aws:sts::000000000000:assumed-role/gpuquota/local"
    assert identity["UserId"].startswith("AROA") and identity["UserId"].endswith(":local")


def test_identity_of_the_key_that_signed(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(auth=Keyring.from_data(KEYS))
    identity = aws("sts", stack, "TEAM1", "team1-secret").get_caller_identity()
    assert identity["Arn"] == "arn:aws:sts::000000000000:assumed-role/gpuquota/TEAM1"
    assert identity["Account"] == "000000000000"
    assert aws("sts", stack, "ADMIN", "admin-secret").get_caller_identity()["Arn"].endswith("/ADMIN")
    assert error_code(aws("sts", stack, "TEAM1", "wrong").get_caller_identity) == "SignatureDoesNotMatch"
    assert error_code(aws("sts", stack, "NOBODY", "x").get_caller_identity) == "InvalidClientTokenId"
    role = aws("iam", stack, "TEAM1", "team1-secret").get_role(RoleName="gpuquota")["Role"]
    assert role["Arn"] == "arn:aws:iam::000000000000:role/gpuquota"


def test_get_role_knows_the_stack_role_only(stack: Stack) -> None:
    iam = aws("iam", stack)
    role = iam.get_role(RoleName="gpuquota")["Role"]
    assert role["Arn"] == "arn:aws:iam::000000000000:role/gpuquota" and role["Path"] == "/"
    statement = role["AssumeRolePolicyDocument"]["Statement"][0]  # botocore decodes the policy
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert error_code(lambda: iam.get_role(RoleName="admin")) == "NoSuchEntity"
    simulate = lambda: iam.simulate_principal_policy(  # noqa: E731
        PolicySourceArn=role["Arn"], ActionNames=["s3:PutObject"]
    )
    assert error_code(simulate) == "AccessDenied"
    assert error_code(lambda: iam.create_role(RoleName="x", AssumeRolePolicyDocument="{}")) == "AccessDenied"
    assume = lambda: aws("sts", stack).assume_role(RoleArn=role["Arn"], RoleSessionName="session")  # noqa: E731
    assert error_code(assume) == "InvalidAction"


def test_the_sdk_resolves_its_role_and_account(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blog's ``ModelTrainer`` has no role: the SDK's own resolver asks STS, then IAM (with its
    validation on: the denied simulation is "cannot verify", the trust policy names SageMaker)."""
    resolver = pytest.importorskip("sagemaker.core.helper.iam_role_resolver")
    session_helper = pytest.importorskip("sagemaker.core.helper.session_helper")
    for name, value in {
        "AWS_ENDPOINT_URL_STS": stack.url,
        "AWS_ENDPOINT_URL_IAM": stack.url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "SAGEMAKER_VALIDATE_ROLE"):
        monkeypatch.delenv(name, raising=False)
    session = session_helper.Session(boto_session=boto3.Session())
    role = resolver.resolve_and_validate_role(sagemaker_session=session)
    assert role == "arn:aws:iam::000000000000:role/gpuquota"


def post(stack: Stack, body: bytes, path: str = "/", **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(stack.url + path, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_the_query_route_under_the_browser_guard(stack: Stack) -> None:
    status, body = post(stack, IDENTITY_BODY, **{"Content-Type": FORM})
    assert status == 200 and b"<Account>000000000000</Account>" in body
    # a page of another site, and DNS rebinding, are refused before the body is read
    assert post(stack, IDENTITY_BODY, **{"Content-Type": FORM, "Origin": "https://evil.example"})[0] == 403
    assert post(stack, IDENTITY_BODY, **{"Content-Type": FORM, "Host": "evil.example:8642"})[0] == 421
    # the exemption is the query route's only: a form to an operation is still a 415
    assert post(stack, b"jobName=x", "/v1/submitservicejob", **{"Content-Type": FORM})[0] == 415
    assert post(stack, IDENTITY_BODY, **{"Content-Type": "text/plain"})[0] == 415
    status, body = post(stack, b"Action=GetCallerIdentity&Version=1999-01-01", **{"Content-Type": FORM})
    assert status == 400 and b"<Code>InvalidAction</Code>" in body
    assert post(stack, b"Action=GetCallerIdentity&Version=2011-06-15&" + b"x" * 20000, **{
        "Content-Type": FORM
    })[0] == 413  # fmt: skip
