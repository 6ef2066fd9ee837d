"""docker-compose.yml stays consistent with the gpuquota settings classes and the Dockerfile."""

from __future__ import annotations

import base64
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gpuquota.settings import SERVICE_SETTINGS, NodeAgentSettings, SchedulerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def _is_gpuquota(service: dict[str, Any]) -> bool:
    return "build" in service or str(service.get("image", "")).startswith("gpuquota")


GPUQUOTA_SERVICES = {name: svc for name, svc in SERVICES.items() if _is_gpuquota(svc)}


def test_expected_services_exist() -> None:
    commands = sorted(_command(svc)[1] for svc in GPUQUOTA_SERVICES.values())
    assert commands == ["gateway", "node-agent", "node-agent", "scheduler"]
    assert SERVICES["kafka"]["image"] == "apache/kafka:4.1.2"
    assert SERVICES["postgres"]["image"] == "postgres:16"


@pytest.mark.parametrize("name", sorted(GPUQUOTA_SERVICES))
def test_gpuquota_service_command_and_env(name: str) -> None:
    service = GPUQUOTA_SERVICES[name]
    command = _command(service)
    assert len(command) == 2 and command[0] == "gpuquota" and command[1] in SERVICE_SETTINGS, command
    settings_cls = SERVICE_SETTINGS[command[1]]
    env = _environment(service)

    unknown = set(env) - settings_cls.ENV_VARS
    assert not unknown, f"{name} sets variables {settings_cls.__name__} does not read: {sorted(unknown)}"
    missing = settings_cls.REQUIRED_ENV_VARS - set(env)
    assert not missing, f"{name} lacks required variables: {sorted(missing)}"
    settings_cls.from_env(env)  # values are valid, not just names


@pytest.mark.parametrize("name", sorted(GPUQUOTA_SERVICES))
def test_gpuquota_service_uses_the_one_image(name: str) -> None:
    service = GPUQUOTA_SERVICES[name]
    assert service["image"] == "gpuquota:dev"
    build = service["build"]
    assert build["dockerfile"] == "deploy/docker/Dockerfile"
    assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def test_addresses_point_at_compose_services() -> None:
    kafka_env = _environment(SERVICES["kafka"])
    pg_env = _environment(SERVICES["postgres"])
    advertised = {urlsplit(u).netloc for u in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    for name, service in GPUQUOTA_SERVICES.items():
        env = _environment(service)
        for server in env["GPUQUOTA_KAFKA"].split(","):
            assert server in advertised, f"{name}: {server} is not an advertised Kafka listener"
        if "GPUQUOTA_DATABASE_URL" in env:
            url = urlsplit(env["GPUQUOTA_DATABASE_URL"])
            assert url.hostname in SERVICES, f"{name}: database host {url.hostname} is not a service"
            assert (url.username, url.password, url.path.lstrip("/")) == (
                pg_env["POSTGRES_USER"],
                pg_env["POSTGRES_PASSWORD"],
                pg_env["POSTGRES_DB"],
            )
        deps = service.get("depends_on", {})
        assert "kafka" in deps


def test_scheduler_inventory_matches_node_agents() -> None:
    schedulers = [s for s in GPUQUOTA_SERVICES.values() if _command(s)[1] == "scheduler"]
    agents = [s for s in GPUQUOTA_SERVICES.values() if _command(s)[1] == "node-agent"]
    (scheduler,) = schedulers
    inventory = {n.node_id: n.gpus for n in SchedulerSettings.from_env(_environment(scheduler)).nodes}
    offered = {}
    for agent in agents:
        settings = NodeAgentSettings.from_env(_environment(agent))
        assert settings.node_id not in offered, f"duplicate node id {settings.node_id}"
        offered[settings.node_id] = settings.gpus
    assert inventory == offered


def test_kafka_cluster_id_is_a_uuid() -> None:
    cluster_id = _environment(SERVICES["kafka"])["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_dockerfile_copies_existing_paths() -> None:
    dockerfile = (ROOT / "deploy/docker/Dockerfile").read_text()
    copies = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copies
    for sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies missing path {source}"


def test_the_gateway_reaches_every_node_agents_log_server() -> None:
    """``gpuquota jobs logs``: GPUQUOTA_NODE_LOGS_URL with a node id is a network alias of that agent,
    which serves its logs on the URL's port."""
    template = _environment(SERVICES["gateway"])["GPUQUOTA_NODE_LOGS_URL"]
    agents = [svc for svc in GPUQUOTA_SERVICES.values() if svc["command"][-1] == "node-agent"]
    assert agents
    for agent in agents:
        settings = NodeAgentSettings.from_env(_environment(agent))
        url = urlsplit(template.format(node_id=settings.node_id))
        assert url.hostname in agent["networks"]["default"]["aliases"]
        assert url.port == settings.logs_port
