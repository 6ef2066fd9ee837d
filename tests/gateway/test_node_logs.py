"""Reading attempt logs from nodes: the node agent's log server, ``HttpLogs`` and ``LocalLogs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.node_routes import HttpLogs, LocalLogs, complete_text
from gpuquota.node_agent.logs import LogServer, log_path
from tests.pipeline.services import free_port


def test_an_incomplete_utf8_character_waits_for_the_next_read() -> None:
    assert complete_text("aé".encode(), final=False) == ("aé", 3)
    assert complete_text(b"a\xc3", final=False) == ("a", 1)
    assert complete_text(b"a\xc3", final=True) == ("a\ufffd", 2)


async def test_log_server_and_http_logs(tmp_path: Path) -> None:
    log_path(tmp_path, "job#1").parent.mkdir(parents=True)
    log_path(tmp_path, "job#1").write_bytes(b"0123456789")
    server = LogServer(tmp_path, "127.0.0.1", 0)
    await server.start()
    try:
        logs = HttpLogs(f"http://127.0.0.1:{server.port}")  # no {node_id}: one node
        assert await logs.read("n1", "job#1", 0, 100) == b"0123456789"
        assert await logs.read("n1", "job#1", 4, 3) == b"456"
        assert await logs.read("n1", "job#1", 20, 3) == b""
        assert await logs.read("n1", "job#2", 0, 100) is None
        local = LocalLogs(lambda node: tmp_path if node == "n1" else None)
        assert await local.read("n1", "job#1", 8, 100) == b"89"
        assert await local.read("elsewhere", "job#1", 0, 100) is None
    finally:
        await server.stop()
    unreachable = HttpLogs(f"http://{{node_id}}:{free_port()}")
    with pytest.raises(ClientException, match="cannot read the log from node 127.0.0.1"):
        await unreachable.read("127.0.0.1", "job#1", 0, 100)


async def test_http_logs_reach_a_node_at_its_advertised_address(tmp_path: Path) -> None:
    """On Kubernetes a node id is the machine's name, not the agent's pod: ``{address}`` is what the node
    registered with (its pod IP); a node that advertised none is named by its id."""
    log_path(tmp_path, "job#1").parent.mkdir(parents=True)
    log_path(tmp_path, "job#1").write_bytes(b"from the pod")
    server = LogServer(tmp_path, "127.0.0.1", 0)
    await server.start()
    try:
        logs = HttpLogs(f"http://{{address}}:{server.port}")
        unresolvable = "gpu-machine-7.invalid"
        assert await logs.read(unresolvable, "job#1", 0, 100, address="127.0.0.1") == b"from the pod"
        assert await logs.read("127.0.0.1", "job#1", 0, 100) == b"from the pod"  # no address: its id
        with pytest.raises(ClientException, match=f"cannot read the log from node {unresolvable}"):
            await logs.read(unresolvable, "job#1", 0, 100)
    finally:
        await server.stop()


def test_a_logs_url_with_an_unknown_field_is_refused_at_start() -> None:
    from gpuquota.config.environ import SettingsError
    from gpuquota.config.settings import GatewaySettings

    env = {"GPUQUOTA_KAFKA": "k:9092", "GPUQUOTA_DATABASE_URL": "postgresql://h/db"}
    assert GatewaySettings.from_env({**env, "GPUQUOTA_NODE_LOGS_URL": "http://{address}:8643"})
    with pytest.raises(SettingsError, match="GPUQUOTA_NODE_LOGS_URL: .*only fields are"):
        GatewaySettings.from_env({**env, "GPUQUOTA_NODE_LOGS_URL": "http://{pod_ip}:8643"})
