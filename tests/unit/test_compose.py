"""docker-compose.yml stays consistent with the gpuquota settings classes and the Dockerfile."""

from __future__ import annotations

import base64
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from jsonschema import Draft201909Validator
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpuquota.config.settings import SERVICE_SETTINGS, NodeAgentSettings

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
    # the images `make images` builds (deploy/local/images.sh): nothing is pulled from a registry
    images_sh = (ROOT / "deploy" / "local" / "images.sh").read_text()
    for service, image in (
        ("kafka", "localhost/gpuquota-kafka:dev"),
        ("postgres", "localhost/gpuquota-postgres:dev"),
    ):
        assert SERVICES[service]["image"] == image
        assert f"build {image} " in images_sh, f"deploy/local/images.sh does not build {image}"


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


def test_valid_for_docker_compose_1_29() -> None:
    """The compose-spec schema of docker-compose 1.29.2 (tests/data; Docker Compose v2 accepts more)."""
    schema = json.loads((ROOT / "tests" / "data" / "compose_spec_v1.29.json").read_text())
    errors = [e.message for e in Draft201909Validator(schema).iter_errors(COMPOSE)]
    assert not errors


def test_the_scheduler_gets_no_variable_it_ignores() -> None:
    (scheduler,) = [s for s in GPUQUOTA_SERVICES.values() if _command(s)[1] == "scheduler"]
    ignored = {"GPUQUOTA_NODES", "GPUQUOTA_PREEMPTION_GRACE"}  # accepted, unused by the Kafka scheduler
    assert not ignored & set(_environment(scheduler))


def test_node_agents_reserve_their_gpus() -> None:
    agents = {n: s for n, s in GPUQUOTA_SERVICES.items() if _command(s)[1] == "node-agent"}
    ids = set()
    for name, agent in agents.items():
        settings = NodeAgentSettings.from_env(_environment(agent))
        ids.add(settings.node_id)
        (device,) = agent["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia", name
        assert (
            device["count"] == settings.gpus
        ), f"{name} offers {settings.gpus} GPUs, reserves {device['count']}"
    assert len(ids) == len(agents), "duplicate node id"


def test_metrics_ports_are_the_scraped_ones() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "monitoring" / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    for name, service in GPUQUOTA_SERVICES.items():
        env = _environment(service)
        port = env.get("GPUQUOTA_METRICS_PORT") or env["GPUQUOTA_PORT"]
        assert f"{name}:{port}" in targets, f"Prometheus does not scrape {name}:{port}"


def test_kafka_cluster_id_is_a_uuid() -> None:
    cluster_id = _environment(SERVICES["kafka"])["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_dockerfile_copies_existing_paths() -> None:
    dockerfile = (ROOT / "deploy/docker/Dockerfile").read_text()
    copies = [
        [part for part in line.split()[1:-1] if not part.startswith(("--", "$"))]
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
    ]
    assert copies
    for sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile copies missing path {source}"


DOCKERFILE = (ROOT / "deploy/docker/Dockerfile").read_text()
LOCK = ROOT / "deploy/docker/requirements.lock"


def test_dockerfile_is_multi_stage_pinned_and_checks_health() -> None:
    base = re.search(r"^ARG BASE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base.group(1)), "pin the base image"
    assert len(re.findall(r"^FROM ", DOCKERFILE, re.MULTILINE)) == 2
    assert "COPY --from=build /opt/gpuquota /opt/gpuquota" in DOCKERFILE
    assert re.search(r"pip install (-q )?pip==[\d.]+", DOCKERFILE)
    assert re.search(r"^USER 10001", DOCKERFILE, re.MULTILINE)
    healthcheck = re.search(r'^\s+CMD \["python", "-m", "([\w.]+)"\]', DOCKERFILE, re.MULTILINE)
    assert "HEALTHCHECK" in DOCKERFILE and healthcheck
    assert (ROOT / "services" / (healthcheck.group(1).replace(".", "/") + ".py")).is_file()


def test_the_lock_pins_every_runtime_dependency() -> None:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned: {line}"
            pins[canonicalize_name(name)] = version
    assert "nvidia-ml-py" in pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for raw in project["dependencies"]:
        requirement = Requirement(raw)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in {LOCK.name}"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} does not satisfy {raw}"


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
