"""``gpuquota env`` against a running stack: what it prints, and that boto3 and the SageMaker SDK's
identity calls reach the stack after ``eval`` (issue #31)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.gateway.auth import Keyring
from tests.gateway.conftest import StackThread

KEYS = [{"access_key": "TEAM1", "secret_key": "team1-secret", "quota_shares": ["jq/QS1"]}]
PROBE = (
    "import boto3; print(boto3.client('sts').get_caller_identity()['Arn']); "
    "print(boto3.client('batch').describe_job_queues()['jobQueues'])"
)


def shell(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_"))}
    profiles = tmp_path / "aws-config"
    profiles.write_text("[profile someone-else]\naws_access_key_id = OTHER\naws_secret_access_key = other\n")
    env |= {"AWS_PROFILE": "someone-else", "AWS_SESSION_TOKEN": "t", "XDG_CONFIG_HOME": str(tmp_path)}
    env["AWS_CONFIG_FILE"] = str(profiles)  # a profile whose key the stack does not know
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


@pytest.fixture
def stack() -> Iterator[StackThread]:
    stack = StackThread()
    stack.gateway.s3_endpoint = "http://127.0.0.1:9999"
    yield stack
    stack.close()


def test_env_without_authentication(stack: StackThread, tmp_path: Path) -> None:
    env = base_env(tmp_path)
    printed = shell(f"gpuquota env --endpoint {stack.url}", env)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    for line in (
        f"export AWS_ENDPOINT_URL_BATCH={stack.url}",
        f"export AWS_ENDPOINT_URL_STS={stack.url}",
        "export AWS_ENDPOINT_URL_S3=http://127.0.0.1:9999",
        "export AWS_DEFAULT_REGION=us-east-1",
        "export AWS_ACCESS_KEY_ID=gpuquota",
        "export SAGEMAKER_VALIDATE_ROLE=false",
    ):
        assert line in lines
    unset = next(line for line in lines if line.startswith("unset "))
    assert {"AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"} <= set(unset.split()[1:])
    config = tmp_path / "gpuquota" / "sagemaker-000000000000-us-east-1.yaml"
    assert "DefaultS3Bucket: sagemaker-us-east-1-000000000000" in config.read_text()
    ran = shell(f'eval "$(gpuquota env --endpoint {stack.url})" && python -c "{PROBE}"', env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["arn:aws:sts::000000000000:assumed-role/gpuquota/local", "[]"]


def test_env_with_authentication_keeps_the_users_key(tmp_path: Path) -> None:
    stack = StackThread(auth=Keyring.from_data(KEYS))
    try:
        env = base_env(tmp_path)
        refused = shell(f"gpuquota env --endpoint {stack.url}", env)
        assert refused.returncode == 1 and refused.stdout == ""
        assert "AWS_ACCESS_KEY_ID" in refused.stderr
        env |= {"AWS_ACCESS_KEY_ID": "TEAM1", "AWS_SECRET_ACCESS_KEY": "team1-secret"}
        printed = shell(f"gpuquota env --endpoint {stack.url}", env)
        assert printed.returncode == 0, printed.stderr
        assert "team1-secret" not in printed.stdout and "AWS_ACCESS_KEY_ID" not in printed.stdout
        assert "assumed-role/gpuquota/TEAM1" in printed.stdout
        whoami = "import boto3; print(boto3.client('sts').get_caller_identity()['Arn'])"
        ran = shell(f'eval "$(gpuquota env --endpoint {stack.url})" && python -c "{whoami}"', env)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines()[0] == "arn:aws:sts::000000000000:assumed-role/gpuquota/TEAM1"
    finally:
        stack.close()


def test_env_gives_the_key_of_the_stacks_own_s3_server_only_without_authentication(
    stack: StackThread, tmp_path: Path
) -> None:
    stack.gateway.s3_client_key = ("gpuquota-local", "s3proxy-secret")  # gpuquota up --s3 local
    printed = shell(f"gpuquota env --endpoint {stack.url}", base_env(tmp_path))
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert "export AWS_ACCESS_KEY_ID=gpuquota-local" in lines
    assert "export AWS_SECRET_ACCESS_KEY=s3proxy-secret" in lines
    guarded = StackThread(auth=Keyring.from_data(KEYS))
    try:
        guarded.gateway.s3_client_key = ("gpuquota-local", "s3proxy-secret")
        env = base_env(tmp_path) | {"AWS_ACCESS_KEY_ID": "TEAM1", "AWS_SECRET_ACCESS_KEY": "team1-secret"}
        printed = shell(f"gpuquota env --endpoint {guarded.url}", env)
        assert printed.returncode == 0, printed.stderr
        assert "s3proxy-secret" not in printed.stdout  # a signed-in user's key is their own
    finally:
        guarded.close()
