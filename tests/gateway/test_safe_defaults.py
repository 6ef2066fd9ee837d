"""The loopback rule (``gpuquota.support.exposure``): ``gpuquota up`` and ``gpuquota gateway`` off loopback
without keys refuse to start, in one line, before they reach Kafka or PostgreSQL; with
``--allow-unauthenticated`` (or its variable) they start and say so in a warning; with keys they start
quietly. Real processes, real sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuquota.support.exposure import is_loopback
from tests.pipeline.services import free_port

#: what every refusal says: how to give keys, and how to override
REFUSAL = (
    "refusing to serve the API on",
    "--auth-keys FILE",
    "GPUQUOTA_AUTH_KEYS",
    "--allow-unauthenticated",
)
WARNING = "without authentication (--allow-unauthenticated)"


def _env(**extra: str) -> dict[str, str]:
    """This process's environment less its ``GPUQUOTA_*`` variables; ``up``'s port picked by the kernel."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    return {**env, "GPUQUOTA_PORT": "0", **extra}


def _gateway_env(**extra: str) -> dict[str, str]:
    return _env(GPUQUOTA_PORT=str(free_port()), **extra)


def gpuquota(*argv: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuquota", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


@contextlib.contextmanager
def listener() -> Iterator[socket.socket]:
    """A listening TCP socket on loopback that nobody accepts on: a stand-in address for Kafka and
    PostgreSQL whose backlog shows whether anything connected."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@contextlib.contextmanager
def running_up(tmp_path: Path, *argv: str, env: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """``gpuquota up`` until its ready line: (its URL, the file its stderr goes to); SIGTERM after."""
    err = tmp_path / "up.stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuquota", "up", "--data-dir", str(tmp_path / "d"), *argv],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # '' once it exits: the assertion shows its stderr
        assert line.startswith("gpuquota ready on http://"), err.read_text()
        yield line.rsplit(" ", 1)[1], err
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_loopback_is_only_what_this_host_reaches() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.0.2.7", "fd00::2", "gateway.example", "", "127.0.0.1.example"):
        assert not is_loopback(host), host


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_up_off_loopback_without_keys_refuses(tmp_path: Path, host: str) -> None:
    result = gpuquota("up", "--host", host, "--data-dir", str(tmp_path), env=_env())
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpuquota up: refusing to serve the API on {host} ")
    assert all(part in lines[0] for part in REFUSAL), lines[0]
    assert result.stdout == ""  # never ready
    assert not (tmp_path / "events.sqlite3").exists()  # nothing opened


def test_up_distributed_off_loopback_refuses_before_reaching_kafka_or_postgresql(tmp_path: Path) -> None:
    with listener() as kafka, listener() as postgres:
        database_url = f"postgresql://u:p@127.0.0.1:{postgres.getsockname()[1]}/db"
        argv = ("--kafka", f"127.0.0.1:{kafka.getsockname()[1]}", "--database-url", database_url)
        result = gpuquota("up", "--host", "0.0.0.0", *argv, env=_env())
        assert result.returncode == 2 and all(part in result.stderr for part in REFUSAL), result.stderr
        assert not connected(kafka) and not connected(postgres)


def test_gateway_off_loopback_without_keys_refuses_before_reaching_its_dependencies() -> None:
    with listener() as kafka, listener() as postgres:
        env = _gateway_env(
            GPUQUOTA_HOST="0.0.0.0",
            GPUQUOTA_KAFKA=f"127.0.0.1:{kafka.getsockname()[1]}",
            GPUQUOTA_DATABASE_URL=f"postgresql://u:p@127.0.0.1:{postgres.getsockname()[1]}/db",
        )
        result = gpuquota("gateway", env=env)
        assert result.returncode == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "gpuquota gateway: refusing to serve the API on 0.0.0.0 "
        )
        assert all(part in lines[0] for part in REFUSAL), lines[0]
        assert not connected(kafka) and not connected(postgres)


@pytest.mark.parametrize("override", ["flag", "variable"])
def test_gateway_override_warns_and_goes_on_to_its_dependencies(override: str) -> None:
    with listener() as free:
        closed = free.getsockname()[1]  # closed when the block ends: nothing listens there
    env = _gateway_env(
        GPUQUOTA_HOST="0.0.0.0",
        GPUQUOTA_KAFKA=f"127.0.0.1:{closed}",
        GPUQUOTA_DATABASE_URL=f"postgresql://u:p@127.0.0.1:{closed}/db",
        GPUQUOTA_STARTUP_TIMEOUT="0.5",
    )
    argv = ["--allow-unauthenticated"] if override == "flag" else []
    if override == "variable":
        env["GPUQUOTA_ALLOW_UNAUTHENTICATED"] = "1"
    result = gpuquota("gateway", *argv, env=env)
    assert result.returncode == 3, result.stderr  # past the rule: Kafka is what stopped it
    lines = result.stderr.splitlines()
    assert "WARNING" in lines[0] and "serving the API on 0.0.0.0 " + WARNING in lines[0], lines
    assert lines[-1].startswith("gpuquota gateway: cannot reach Kafka"), lines


def test_up_override_starts_with_a_warning_and_answers_off_loopback(tmp_path: Path) -> None:
    env = _env(GPUQUOTA_ALLOW_UNAUTHENTICATED="true")
    with running_up(tmp_path, "--host", "0.0.0.0", "--runtime", "simulated", env=env) as (url, err):
        assert url.startswith("http://0.0.0.0:")
        with urllib.request.urlopen(url.replace("0.0.0.0", "127.0.0.1") + "/health", timeout=10) as response:
            assert response.status == 200
        warnings = [line for line in err.read_text().splitlines() if "WARNING" in line]
        assert len(warnings) == 1 and "serving the API on 0.0.0.0 " + WARNING in warnings[0], warnings


def test_up_with_keys_off_loopback_starts_without_a_warning(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("- {access_key: ADMIN, secret_key: a-long-secret-key, admin: true}\n")
    with running_up(
        tmp_path, "--host", "0.0.0.0", "--auth-keys", str(keys), "--runtime", "simulated", env=_env()
    ) as (
        _,
        err,
    ):
        assert "WARNING" not in err.read_text()


def test_a_bad_override_value_is_a_configuration_error(tmp_path: Path) -> None:
    result = gpuquota("up", "--host", "0.0.0.0", env=_env(GPUQUOTA_ALLOW_UNAUTHENTICATED="maybe"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpuquota up: GPUQUOTA_ALLOW_UNAUTHENTICATED: expected 1 or 0, true or false (got 'maybe')"
    )
