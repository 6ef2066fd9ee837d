"""``GpuquotaContainer``: gpuquota in a testcontainers container, for a training platform's tests.

A :class:`testcontainers.core.container.DockerContainer` of the gpuquota image (``gpuquota:dev``,
``make images`` builds it) running ``gpuquota up``: the gateway, the scheduler and local node agents of
the embedded mode in one container, its API on a mapped port. Use it like any testcontainers
container::

    with GpuquotaContainer(nodes="ml.g5.xlarge=2") as gpuquota:
        batch = gpuquota.get_client()          # boto3 "batch" client of the container's endpoint
        batch.create_scheduling_policy(...)

``get_endpoint_url()`` is the gateway's URL (for ``AWS_ENDPOINT_URL_BATCH``, the SageMaker SDK,
``gpuquota --endpoint``). It needs what testcontainers needs: a Docker API (a Docker daemon, or podman's
``podman system service`` named by ``DOCKER_HOST``); docs/testing-your-platform.md shows both. The
pytest plugin's ``docker`` mode (:mod:`gpuquota.testing`) starts one per test.

Imported lazily by :mod:`gpuquota.testing` (``from gpuquota.testing import GpuquotaContainer``), so the
plugin loads where testcontainers is not installed.
"""

from __future__ import annotations

from typing import Any

from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from gpuquota.testing.defaults import CONTAINER_PORT, DEFAULT_IMAGE, DEFAULT_NODES, REGION

READY_LINE = "gpuquota ready on"  # what `gpuquota up` prints once its gateway listens


class GpuquotaContainer(DockerContainer):
    """``gpuquota up`` in a container of ``image``: ``nodes`` (``UNIT=COUNT,...``) local node agents with
    the ``simulated`` (default) or ``process`` runtime, the event log in SQLite inside the container."""

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        nodes: str = DEFAULT_NODES,
        runtime: str = "simulated",
        start_timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(image, **kwargs)
        command = [
            "gpuquota", "up", "--host", "0.0.0.0", "--allow-unauthenticated", "--port", str(CONTAINER_PORT),
            "--nodes", nodes, "--runtime", runtime, "--data-dir", "/tmp/gpuquota",
        ]  # fmt: skip
        self.with_command(command)
        self.with_exposed_ports(CONTAINER_PORT)
        self.waiting_for(LogMessageWaitStrategy(READY_LINE).with_startup_timeout(int(start_timeout)))

    def get_endpoint_url(self) -> str:
        """The gateway's URL on this machine, e.g. ``http://localhost:41873``."""
        return f"http://{self.get_container_host_ip()}:{self.get_exposed_port(CONTAINER_PORT)}"

    def get_client(self, service: str = "batch", **kwargs: Any) -> Any:
        """A boto3 client of ``service`` for the endpoint (dummy credentials, region us-east-1)."""
        import boto3

        options: dict[str, Any] = {
            "endpoint_url": self.get_endpoint_url(),
            "region_name": REGION,
            "aws_access_key_id": "gpuquota-test",
            "aws_secret_access_key": "gpuquota-test",
            **kwargs,
        }
        return boto3.client(service, **options)
