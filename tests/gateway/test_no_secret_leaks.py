"""Secrets never appear in logs, ``/metrics``, error messages or ``gpuquota version``: a real
``gpuquota up --auth-keys FILE`` logging at DEBUG with a known secret key, driven through every kind of
authentication failure, and the services' start-up errors with a known database password and node
token in their configuration. Each assertion looks for the secret's exact text."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.pipeline.services import free_port

SECRET_KEY = "Secret-Key-7f3a9c-never-shown"
PASSWORD = "Db-Password-51e2-never-shown"
NODE_TOKEN = "Node-Token-9b0d-never-shown"
SECRETS = (SECRET_KEY, PASSWORD, NODE_TOKEN)


def assert_hidden(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} shown in:\n{text}"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    return {**env, "GPUQUOTA_LOG_LEVEL": "DEBUG", **extra}


def gpuquota(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuquota", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def client(url: str, access_key: str, secret: str, **config: Any) -> Any:
    return boto3.client(
        "batch",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, **config),
    )


def error_of(call: Any) -> str:
    with pytest.raises(ClientError) as caught:
        call()
    return str(caught.value.response)


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


def test_up_with_keys_at_debug_never_shows_the_secret_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"- {{access_key: ADMIN, secret_key: {SECRET_KEY}, admin: true}}\n")
    out, err = tmp_path / "up.stdout", tmp_path / "up.stderr"
    argv = [
        "up",
        "--auth-keys",
        str(keys),
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "d"),
        "--runtime",
        "simulated",
    ]
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota", *argv], stdout=stdout, stderr=stderr, env=_env()
        )
    try:
        url = _ready_url(proc, out, err)
        good = client(url, "ADMIN", SECRET_KEY)
        assert good.describe_job_queues()["jobQueues"] == []  # signed with the key: answered
        answers = [
            error_of(lambda: client(url, "ADMIN", "not-the-secret").list_service_jobs(jobQueue="jq")),
            error_of(lambda: client(url, "NOBODY", SECRET_KEY).list_service_jobs(jobQueue="jq")),
            error_of(
                lambda: client(url, "ADMIN", SECRET_KEY, signature_version=UNSIGNED).list_service_jobs(
                    jobQueue="jq"
                )
            ),
            error_of(lambda: good.describe_service_job(jobId="no-such-job")),
        ]
        assert [a.count("Exception") > 0 for a in answers] == [True] * 4
        scraped = [get(url + path) for path in ("/metrics", "/health/ready", "/health", "/console/")]
        assert "gpuquota_" in scraped[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    logged = err.read_text()
    assert "SigV4 authentication on, 1 keys from" in logged  # its log, at DEBUG (nothing more there)
    assert_hidden(out.read_text(), logged, *answers, *scraped)


def _ready_url(proc: subprocess.Popen[bytes], out: Path, err: Path, ready: str = "gpuquota ready on ") -> str:
    """The URL of the service's ready line, waiting for it (or its exit) with a deadline."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in out.read_text().splitlines():
            if line.startswith(ready):
                return line.rsplit(" ", 1)[1]
        assert proc.poll() is None, err.read_text()
        time.sleep(0.05)  # polling a file for a line: no event to wait on
    raise AssertionError(f"gpuquota up not ready within 60 s:\n{err.read_text()}")


@contextlib.contextmanager
def _listener() -> Any:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def test_settings_and_start_up_errors_never_show_the_password_or_token(tmp_path: Path) -> None:
    closed = free_port()
    url = f"postgresql://gpuquota:{PASSWORD}@127.0.0.1:{closed}/gpuquota"
    gateway = {"GPUQUOTA_KAFKA": f"127.0.0.1:{closed}", "GPUQUOTA_STARTUP_TIMEOUT": "0.5"}
    results = [
        # a bad variable beside the URL, a malformed URL, the token too short, both token sources
        gpuquota("gateway", env=_env(**gateway, GPUQUOTA_DATABASE_URL=url, GPUQUOTA_PORT="none")),
        gpuquota("gateway", env=_env(**gateway, GPUQUOTA_DATABASE_URL=f"postgresql://u:{PASSWORD}@db")),
        gpuquota(
            "gateway", env=_env(**gateway, GPUQUOTA_DATABASE_URL=url, GPUQUOTA_NODE_TOKEN=NODE_TOKEN[:8])
        ),
        gpuquota(
            "gateway",
            env=_env(
                **gateway,
                GPUQUOTA_DATABASE_URL=url,
                GPUQUOTA_NODE_TOKEN=NODE_TOKEN,
                GPUQUOTA_NODE_TOKEN_FILE="/x",
            ),
        ),
        gpuquota(
            "node-agent",
            env=_env(GPUQUOTA_KAFKA="k:1", GPUQUOTA_NODE_ID="n", GPUQUOTA_NODE_TOKEN=NODE_TOKEN[:8]),
        ),
        # the distributed `gpuquota up` and the gateway with PostgreSQL unreachable
        gpuquota(
            "up",
            "--kafka",
            f"127.0.0.1:{closed}",
            "--database-url",
            url,
            env=_env(GPUQUOTA_STARTUP_TIMEOUT="0.5"),
        ),
        gpuquota("version", env=_env(GPUQUOTA_DATABASE_URL=url, GPUQUOTA_NODE_TOKEN=NODE_TOKEN)),
        gpuquota("--version", env=_env(GPUQUOTA_DATABASE_URL=url)),
    ]
    with _listener() as kafka:
        env = _env(
            GPUQUOTA_KAFKA=f"127.0.0.1:{kafka}", GPUQUOTA_STARTUP_TIMEOUT="0.5", GPUQUOTA_DATABASE_URL=url
        )
        results.append(gpuquota("gateway", env={**env, "GPUQUOTA_NODE_TOKEN": NODE_TOKEN}))
    codes = [r.returncode for r in results]
    assert codes == [2, 2, 2, 2, 2, 3, 0, 0, 3], [r.stderr for r in results]
    assert "cannot reach PostgreSQL at 127.0.0.1:" in results[-1].stderr
    assert "GPUQUOTA_DATABASE_URL" in results[1].stderr and "GPUQUOTA_NODE_TOKEN" in results[2].stderr
    assert_hidden(*(r.stdout + r.stderr for r in results))


def test_a_broken_keys_file_is_reported_without_quoting_it(tmp_path: Path) -> None:
    broken = {
        "keys.yaml": f'- access_key: ADMIN\n  secret_key: "{SECRET_KEY}\n  admin: true\n',  # unclosed quote
        "tabs.yaml": f"- access_key: ADMIN\n\tsecret_key: {SECRET_KEY}\n",
        "keys.json": f'[{{"access_key": "ADMIN", "secret_key": "{SECRET_KEY}",}}]',
        "shape.yaml": f"- {{access_key: ADMIN, secret_key: {SECRET_KEY}, admin: {SECRET_KEY}}}\n",
    }
    for name, text in broken.items():
        (tmp_path / name).write_text(text)
        result = gpuquota(
            "up", "--auth-keys", str(tmp_path / name), "--data-dir", str(tmp_path / "d"), env=_env()
        )
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert f"auth keys file {tmp_path / name}" in result.stderr
        assert_hidden(result.stdout, result.stderr)


def test_jobs_do_not_inherit_the_secrets_of_their_agent(tmp_path: Path) -> None:
    """The process runtime's jobs inherit the service's environment, less its secret variables."""
    from tests.gateway.helpers import worked_example

    env = _env(GPUQUOTA_NODE_TOKEN=NODE_TOKEN, GPUQUOTA_PORT=str(free_port()))
    out, err = tmp_path / "up.stdout", tmp_path / "up.stderr"
    argv = ["up", "--data-dir", str(tmp_path / "d"), "--runtime", "process"]
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota", *argv], stdout=stdout, stderr=stderr, env=env
        )
    try:
        url = _ready_url(proc, out, err)
        worked_example(client(url, "x", "y"))
        script = "import os; print(sorted(k for k in os.environ if k.startswith('GPUQUOTA_')))"
        submit = ["jobs", "submit", "--queue", "jq", "--share", "QS1", "--unit", "ml.g5.xlarge"]
        job = gpuquota("--endpoint", url, *submit, "--", sys.executable, "-c", script, env=env)
        assert job.returncode == 0, job.stderr
        logs = gpuquota("--endpoint", url, "jobs", "logs", job.stdout.strip(), "--follow", env=env)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert logs.returncode == 0 and "GPUQUOTA_JOB_ID" in logs.stdout, logs.stderr
    assert (
        "GPUQUOTA_LOG_LEVEL" in logs.stdout and "GPUQUOTA_NODE_TOKEN" not in logs.stdout
    )  # inherited, less it


@pytest.mark.integration
def test_the_distributed_gateway_at_debug_never_shows_its_secrets(
    tmp_path: Path, kafka_bootstrap: str, database_url: str
) -> None:
    """``gpuquota gateway`` on the real broker and database, logging at DEBUG (aiokafka's loggers too),
    with keys, a node token and the database's password (run it with ``PG_PASSWORD=...`` for a password
    distinct from the user's name). (The project's PostgreSQL trusts local connections, so a refused
    password cannot be tried here.)"""
    from urllib.parse import urlsplit

    password = urlsplit(database_url).password or ""
    secrets = [
        s for s in (SECRET_KEY, NODE_TOKEN, password) if s and s not in database_url.replace(f":{s}@", "@")
    ]
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"- {{access_key: ADMIN, secret_key: {SECRET_KEY}, admin: true}}\n")
    run = os.urandom(4).hex()
    env = _env(
        GPUQUOTA_KAFKA=kafka_bootstrap,
        GPUQUOTA_DATABASE_URL=database_url,
        GPUQUOTA_PORT=str(free_port()),
        GPUQUOTA_TOPIC_PREFIX=f"leak{run}.",
        GPUQUOTA_POOL=f"p-{run}",
        GPUQUOTA_AUTH_KEYS=str(keys),
        GPUQUOTA_NODE_TOKEN=NODE_TOKEN,
        GPUQUOTA_NODE_LOGS_URL=f"http://127.0.0.1:{free_port()}",
    )
    out, err = tmp_path / "gw.stdout", tmp_path / "gw.stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota", "gateway"], stdout=stdout, stderr=stderr, env=env
        )
    try:
        url = _ready_url(proc, out, err, ready="gpuquota gateway ready on ")
        good = client(url, "ADMIN", SECRET_KEY)
        assert good.describe_job_queues()["jobQueues"] == []  # signed: answered (no scheduler runs)
        answers = [
            error_of(lambda: client(url, "ADMIN", "not-the-secret").describe_job_queues()),
            error_of(lambda: client(url, "NOBODY", SECRET_KEY).describe_job_queues()),
            error_of(lambda: good.describe_service_job(jobId="no-such-job")),
        ]
        scraped = [get(url + path) for path in ("/metrics", "/health/ready")]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    texts = [out.read_text(), err.read_text(), *answers, *scraped]
    assert "DEBUG" in texts[1]
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"{secret!r} shown in:\n{text[-3000:]}"
