"""A node agent's log server follows the loopback rule (``gpuquota.support.exposure``): with the node token it
answers only requests that carry it; off loopback without one, ``gpuquota node-agent`` refuses to start
(before it reaches Kafka) unless ``--allow-unauthenticated``. The log server on a real socket, bound
to an address other than loopback where this host has one, and real ``gpuquota node-agent`` processes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.node_routes import HttpLogs
from gpuquota.node_agent.logs import LogServer, log_path
from gpuquota.support.exposure import MIN_TOKEN_LENGTH, TokenError, bearer_matches, read_token
from tests.pipeline.services import free_port

TOKEN = "node-token-0123456789abcdef"
ATTEMPT = "job-a#1"


def outside_address() -> str:
    """An address of this host that is not loopback (what another host would connect to); 127.0.0.1
    where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: the kernel picks the outgoing address
            address = str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"
    return address


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    path = log_path(tmp_path, ATTEMPT)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the job's private output\n")
    return tmp_path


async def test_with_a_token_only_requests_that_carry_it_read_logs(work_dir: Path) -> None:
    host = outside_address()
    server = LogServer(work_dir, "0.0.0.0", 0, token=TOKEN)
    await server.start()
    try:
        url = f"http://{host}:{server.port}/logs/job-a%231"
        for headers in (None, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            status, body = await asyncio.to_thread(fetch, url, headers)
            assert (status, body) == (401, b"node token required"), headers
        # refused before the path is looked at: a missing log and an existing one answer alike
        assert (await asyncio.to_thread(fetch, url.replace("a%231", "b%231")))[0] == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert await asyncio.to_thread(fetch, url, good) == (200, b"the job's private output\n")
        assert await HttpLogs(f"http://{host}:{server.port}", TOKEN).read("n1", ATTEMPT, 4, 3) == b"job"
        with pytest.raises(ClientException, match="refused the gateway's node token \\(none given\\)"):
            await HttpLogs(f"http://{host}:{server.port}").read("n1", ATTEMPT, 0, 100)
        with pytest.raises(ClientException, match="not the one it holds"):
            await HttpLogs(f"http://{host}:{server.port}", "x" * MIN_TOKEN_LENGTH).read("n1", ATTEMPT, 0, 9)
    finally:
        await server.stop()


async def test_without_a_token_anyone_reads_logs(work_dir: Path) -> None:
    """What the rule guards against: the server without a token (loopback, or the override)."""
    server = LogServer(work_dir, "127.0.0.1", 0)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/logs/job-a%231"
        assert await asyncio.to_thread(fetch, url) == (200, b"the job's private output\n")
    finally:
        await server.stop()


def test_bearer_matches_only_the_token() -> None:
    assert bearer_matches(f"Bearer {TOKEN}", TOKEN) and bearer_matches(f"bearer  {TOKEN} ", TOKEN)
    for header in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"):
        assert not bearer_matches(header, TOKEN), header


def test_the_token_comes_from_a_file_or_the_variable_never_both(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(TOKEN + "\n")
    assert read_token("", file) == TOKEN
    assert read_token(TOKEN, None) == TOKEN
    assert read_token("", None) is None
    with pytest.raises(TokenError, match="not both"):
        read_token(TOKEN, file)
    with pytest.raises(TokenError, match="cannot read the node token file"):
        read_token("", tmp_path / "missing")
    file.write_text("short")
    with pytest.raises(TokenError, match=f"at least {MIN_TOKEN_LENGTH}") as caught:
        read_token("", file)
    assert "short" not in str(caught.value).replace(str(file), "")


def node_agent(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``gpuquota node-agent --logs-port`` with a Kafka nobody listens on: a start-up refused by the
    loopback rule exits 2 at once, one that passes it waits for Kafka and exits 3."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    settings = {
        "GPUQUOTA_KAFKA": f"127.0.0.1:{free_port()}",
        "GPUQUOTA_NODE_ID": "n1",
        "GPUQUOTA_SLOTS": "ml.g5.xlarge=1",
        "GPUQUOTA_RUNTIME": "simulated",
        "GPUQUOTA_DATA_DIR": str(tmp_path / "node"),
        "GPUQUOTA_STARTUP_TIMEOUT": "0.5",
        "GPUQUOTA_LOGS_PORT": str(free_port()),
    }
    return subprocess.run(
        [sys.executable, "-m", "gpuquota", "node-agent", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, **settings, **env},
    )


def test_node_agent_off_loopback_without_a_token_refuses(tmp_path: Path) -> None:
    for argv in ((), ("--check",)):
        result = node_agent(tmp_path, *argv)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("gpuquota node-agent: refusing to serve attempt logs on 0.0.0.0 ")
        for part in ("--node-token-file FILE", "GPUQUOTA_NODE_TOKEN_FILE", "--allow-unauthenticated"):
            assert part in lines[0]


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (("--logs-host", "127.0.0.1"), {}),  # loopback: no token needed
        ((), {"GPUQUOTA_NODE_TOKEN": TOKEN}),
        (("--allow-unauthenticated",), {}),
        ((), {"GPUQUOTA_ALLOW_UNAUTHENTICATED": "1"}),
    ],
)
def test_node_agent_with_a_token_loopback_or_the_override_goes_on(
    tmp_path: Path, argv: tuple[str, ...], env: dict[str, str]
) -> None:
    result = node_agent(tmp_path, *argv, **env)
    assert result.returncode == 3, result.stderr  # past the rule: Kafka is what stopped it
    assert result.stderr.splitlines()[-1].startswith("gpuquota node-agent: cannot reach Kafka")
    warned = "serving attempt logs on 0.0.0.0 without authentication" in result.stderr
    assert warned == ("allow" in str(argv) + str(env).lower()), result.stderr


def test_node_agent_token_file(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(TOKEN)
    result = node_agent(tmp_path, "--node-token-file", str(file))
    assert result.returncode == 3 and "WARNING" not in result.stderr, result.stderr
    file.write_text("short")
    result = node_agent(tmp_path, "--node-token-file", str(file))
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"gpuquota node-agent: the node token ({file}) must be at least 16 characters"
    )
