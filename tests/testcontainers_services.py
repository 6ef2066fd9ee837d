"""Kafka and PostgreSQL as testcontainers containers of the local images (``make images``), through
podman's Docker-compatible API where no Docker daemon runs.

``docker_host()`` is the Docker API the containers go to: ``DOCKER_HOST`` when set, else the podman
socket ``deploy/local/test-stack.sh`` started (``GPUQUOTA_TEST_DOCKER_HOST``), else one started here
for this process (``deploy/local/podman.sh socket-start``, stopped at exit). It also sets what
testcontainers needs on podman: ``TESTCONTAINERS_CONNECTION_MODE=docker_host`` (containers are reached
on this machine's mapped ports) and Ryuk disabled (its image is on a registry this machine does not
reach; each container here is stopped by the context manager that started it).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PODMAN_SH = ROOT / "deploy" / "local" / "podman.sh"
KAFKA_IMAGE = os.environ.get("GPUQUOTA_TEST_KAFKA_IMAGE", "localhost/gpuquota-kafka:dev")
POSTGRES_IMAGE = os.environ.get("GPUQUOTA_TEST_POSTGRES_IMAGE", "localhost/gpuquota-postgres:dev")


@functools.cache
def docker_host() -> str:
    """The ``DOCKER_HOST`` of the containers (exported to this process, with testcontainers' settings)."""
    host = os.environ.get("DOCKER_HOST") or os.environ.get("GPUQUOTA_TEST_DOCKER_HOST") or _own_socket()
    os.environ["DOCKER_HOST"] = host
    os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    # testcontainers reads its settings when first imported; set them on its config too
    from testcontainers.core.config import ConnectionMode, testcontainers_config

    testcontainers_config.connection_mode_override = ConnectionMode(
        os.environ["TESTCONTAINERS_CONNECTION_MODE"]
    )
    testcontainers_config.ryuk_disabled = os.environ["TESTCONTAINERS_RYUK_DISABLED"] == "true"
    return host


def _own_socket() -> str:
    run_dir = tempfile.mkdtemp(prefix="gpuquota-podman-api.")
    atexit.register(subprocess.run, ["bash", str(PODMAN_SH), "socket-stop", run_dir], check=False)
    started = subprocess.run(
        ["bash", str(PODMAN_SH), "socket-start", run_dir], capture_output=True, text=True, timeout=60
    )
    if started.returncode != 0:
        raise RuntimeError(f"podman.sh socket-start: {started.stderr.strip()}")
    return started.stdout.strip()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def kafka_container(image: str = KAFKA_IMAGE) -> Iterator[str]:
    """A single-node KRaft broker; yields its bootstrap address ``127.0.0.1:PORT``.

    The broker must advertise the address clients use, known only once a host port is chosen: so the
    port is chosen here and bound explicitly (testcontainers' own Kafka module rewrites the advertised
    listener from a start script of the Confluent image instead)."""
    docker_host()
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    port = _free_port()
    container = (
        DockerContainer(image)
        .with_bind_ports(9092, port)
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{port}")
        .with_env("KAFKA_NUM_PARTITIONS", "1")
        .waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(120))
    )
    with container:
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def postgres_container(image: str = POSTGRES_IMAGE) -> Iterator[str]:
    """A PostgreSQL server; yields ``postgresql://gpuquota:PASSWORD@HOST:PORT/gpuquota``."""
    docker_host()
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    password = uuid.uuid4().hex
    # the entry point's private initialisation server logs the line first, the real one second
    ready = LogMessageWaitStrategy("database system is ready to accept connections", times=2)
    container = (
        DockerContainer(image)
        .with_env("POSTGRES_USER", "gpuquota")
        .with_env("POSTGRES_PASSWORD", password)
        .with_env("POSTGRES_DB", "gpuquota")
        .with_env("POSTGRES_FSYNC", "off")  # a throwaway database
        .with_exposed_ports(5432)
        .waiting_for(ready.with_startup_timeout(120))
    )
    with container:
        host = container.get_container_host_ip()
        yield f"postgresql://gpuquota:{password}@{host}:{container.get_exposed_port(5432)}/gpuquota"
