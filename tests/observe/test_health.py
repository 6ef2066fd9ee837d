"""``/health/live`` and ``/health/ready`` (I7) and the start-up checks: unreachable dependencies, unknown
``GPUQUOTA_*`` variables."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuquota.observe import healthcheck
from gpuquota.observe.health import OpsServer, add_routes, broker_probe, lag_probe, readiness
from gpuquota.observe.metrics import new_registry
from gpuquota.observe.startup import EXIT_UNREACHABLE, Unreachable, unknown_variables, wait_for
from gpuquota.read.model import ReadModel
from gpuquota.wire import events as ev
from tests.gateway.conftest import wait_for as wait_until
from tests.gateway.helpers import submit, worked_example
from tests.observe.helpers import get_json, stack, two_steps


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on (bound, never listening, so nobody else takes it meanwhile)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port that accepts TCP connections (and says nothing): "Kafka answers" for the start-up check."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


def test_ready_says_what_is_not_ready(tmp_path: Path) -> None:
    running = stack(data_dir=tmp_path)
    try:
        two_steps(running.client)
        assert get_json(running.url + "/health/live") == (200, {"status": "live"})
        assert get_json(running.url + "/health/ready") == (
            200,
            {"status": "ready", "checks": {"eventLog": "ok"}},
        )
        assert get_json(running.url + "/health") == (200, {"status": "ok"})
        store = running.stack.store
        assert store is not None
        running.run(store.close())  # the event log is gone: the stack can decide nothing
        code, body = get_json(running.url + "/health/ready")
        assert code == 503
        assert body["status"] == "not ready"
        assert body["checks"]["eventLog"] != "ok"
        assert get_json(running.url + "/health/live")[0] == 200
    finally:
        running.close()


def test_live_is_503_once_the_embedded_read_model_cannot_apply_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded shell logs a projection error and decides on: ``/health/live`` makes it loud."""

    def projection_bug(_: ReadModel, event: ev.JobAccepted) -> None:
        raise RuntimeError("a projection bug")

    monkeypatch.setattr(ReadModel, "_on_JobAccepted", projection_bug)
    running = stack(data_dir=tmp_path)
    try:
        worked_example(running.client)
        assert get_json(running.url + "/health/live") == (200, {"status": "live"})
        submit(running.client, "job", "QS1", 1)
        wait_until(lambda: get_json(running.url + "/health/live")[0] == 503, timeout=30)
        reason = get_json(running.url + "/health/live")[1]["reason"]
        assert reason.startswith("the read model could not apply JobAccepted "), reason
        assert "a projection bug" in reason
    finally:
        running.close()


async def test_probes_name_the_unreachable_broker_and_the_lag(closed_port: int, listening_port: int) -> None:
    ok, checks = await readiness(
        {
            "broker": broker_probe(f"127.0.0.1:{closed_port}"),
            "other": broker_probe(f"127.0.0.1:{listening_port}"),
            "readModel": lag_probe(lambda: _const(250)),
            "caughtUp": lag_probe(lambda: _const(3)),
        }
    )
    assert not ok
    assert checks["broker"].startswith(f"Kafka unreachable at 127.0.0.1:{closed_port}")
    assert checks["other"] == "ok"
    assert checks["readModel"] == "250 log records behind"
    assert checks["caughtUp"] == "ok"


async def _const(value: int) -> int:
    return value


async def test_ops_server_answers_503_with_the_checks(closed_port: int) -> None:
    server = OpsServer(new_registry(), {"broker": broker_probe(f"127.0.0.1:{closed_port}")}, "127.0.0.1", 0)
    await server.start()
    try:
        code, body = await asyncio.to_thread(get_json, server.url + "/health/ready")
        assert code == 503 and body["status"] == "not ready" and "unreachable" in body["checks"]["broker"]
        assert (await asyncio.to_thread(get_json, server.url + "/health/live"))[0] == 200
    finally:
        await server.stop()


async def test_wait_for_retries_with_back_off_then_gives_up(closed_port: int) -> None:
    with pytest.raises(Unreachable, match=rf"cannot reach Kafka at 127.0.0.1:{closed_port} after 0.3 s"):
        await wait_for("test", "Kafka", [("127.0.0.1", closed_port)], 0.3, first_delay=0.05)


def test_unknown_variables_name_the_closest_known_one() -> None:
    env = {
        "GPUQUOTA_PROT": "1",
        "GPUQUOTA_PORT": "2",
        "GPUQUOTA_KAFAK": "x",
        "GPUQUOTA_ZZZZZZZZZ": "",
        "HOME": "/",
    }
    assert unknown_variables(env) == [
        "unknown variable GPUQUOTA_KAFAK is ignored; did you mean GPUQUOTA_KAFKA?",
        "unknown variable GPUQUOTA_PROT is ignored; did you mean GPUQUOTA_PORT?",
        "unknown variable GPUQUOTA_ZZZZZZZZZ is ignored",
    ]


def _service(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    return subprocess.run(
        [sys.executable, "-m", "gpuquota", command],
        env={**clean, "GPUQUOTA_STARTUP_TIMEOUT": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_service_without_kafka_exits_3_with_one_line_naming_it(closed_port: int) -> None:
    done = _service(
        "scheduler",
        {
            "GPUQUOTA_KAFKA": f"127.0.0.1:{closed_port}",
            "GPUQUOTA_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/db",
            "GPUQUOTA_PROT": "8080",
        },
    )
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert "unknown variable GPUQUOTA_PROT is ignored; did you mean GPUQUOTA_PORT?" in lines[0]
    assert lines[-1].startswith(
        f"gpuquota scheduler: cannot reach Kafka at 127.0.0.1:{closed_port} after 1 s"
    )
    assert any("retrying in" in line for line in lines[1:-1])


def test_a_service_without_postgresql_exits_3_naming_it(listening_port: int, closed_port: int) -> None:
    done = _service(
        "gateway",
        {
            "GPUQUOTA_KAFKA": f"127.0.0.1:{listening_port}",
            "GPUQUOTA_DATABASE_URL": f"postgresql://u:secret@127.0.0.1:{closed_port}/db",
        },
    )
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    assert "Traceback" not in done.stderr and "secret" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpuquota gateway: cannot reach PostgreSQL at 127.0.0.1:{closed_port} after 1 s")


async def test_the_image_healthcheck_asks_health_live(closed_port: int) -> None:
    server = OpsServer(new_registry(), {}, "127.0.0.1", 0)
    await server.start()
    try:
        assert await asyncio.to_thread(healthcheck.main, {"GPUQUOTA_METRICS_PORT": str(server.port)}) == 0
        assert await asyncio.to_thread(healthcheck.main, {"GPUQUOTA_PORT": str(server.port)}) == 0
        assert await asyncio.to_thread(healthcheck.main, {"GPUQUOTA_PORT": str(closed_port)}) == 1
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("argv", "port"),
    [
        (["/opt/gpuquota/bin/python", "/opt/gpuquota/bin/gpuquota", "up", "--host", "0.0.0.0"], "8642"),
        (["gpuquota", "up", "--port", "9000"], "9000"),
        (["gpuquota", "up", "--port=9001"], "9001"),
        (["gpuquota", "gateway"], "8080"),
        ([], "8080"),
    ],
)
def test_the_healthcheck_port_follows_the_command(argv: list[str], port: str) -> None:
    assert healthcheck.url({}, argv) == f"http://127.0.0.1:{port}/health/live"
    assert healthcheck.url({"GPUQUOTA_PORT": "7000"}, argv) == "http://127.0.0.1:7000/health/live"
    assert healthcheck.url({"GPUQUOTA_METRICS_PORT": "9464", "GPUQUOTA_PORT": "7000"}, argv).endswith(
        ":9464/health/live"
    )


async def test_live_is_503_with_the_reason_once_something_broke_for_good() -> None:
    """A liveness check (the gateway's read model that cannot be rebuilt from the log) fails
    ``/health/live``: only a restart helps, and the body says why."""
    broken: list[str | None] = [None]
    app = web.Application()
    add_routes(app.router, new_registry(), {}, lambda: broken[0])
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/health/live")).status == 200
        broken[0] = "the read model cannot be rebuilt from the log: IllegalTransition(...)"
        answer = await client.get("/health/live")
        assert answer.status == 503
        assert await answer.json() == {"status": "not live", "reason": broken[0]}
