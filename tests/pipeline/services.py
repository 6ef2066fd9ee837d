"""Run ``gpuquota <service>`` as a subprocess configured by ``GPUQUOTA_*`` variables (pipeline tests)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import boto3


def batch_client(url: str) -> Any:
    """A boto3 Batch client of the gateway at ``url`` (authentication off: any keys)."""
    return boto3.client(
        "batch", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServiceProcess:
    """``python -m gpuquota <command>``; ``start()`` returns once it printed its ready line."""

    def __init__(
        self, command: str, env: dict[str, str], log_path: Path, args: list[str] | None = None
    ) -> None:
        self.command = command
        self.args = args or []
        self.ready_line = ""
        self.env = {**os.environ, "GPUQUOTA_LOG_LEVEL": "INFO", **env}
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float = 60) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuquota", self.command, *self.args,
                env=self.env, stdout=asyncio.subprocess.PIPE, stderr=log,
            )  # fmt: skip
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"gpuquota {self.command} exited early:\n{self.tail()}")
                if b"ready" in line:
                    self.ready_line = line.decode().strip()
                    return

    def tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        assert self.proc.returncode is not None
        return self.proc.returncode

    async def kill(self) -> None:
        """SIGKILL (``kill -9``): no clean-up of any kind."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


class Services:
    """The ``gpuquota`` services of one test, configured for its broker, database, topics and pool.

    ``scheduler()``, ``gateway()`` and ``node_agent()`` build a ``ServiceProcess`` with the common
    variables plus the given ones; the ``services`` fixture kills whatever is still running at the end
    and prints each one's log tail (shown when the test failed).
    """

    def __init__(self, kafka: str, database_url: str, prefix: str, pool: str, tmp_path: Path) -> None:
        self.common = {"GPUQUOTA_KAFKA": kafka, "GPUQUOTA_TOPIC_PREFIX": prefix, "GPUQUOTA_POOL": pool}
        self.database = {"GPUQUOTA_DATABASE_URL": database_url}
        self.tmp_path = tmp_path
        self.made: list[ServiceProcess] = []

    def _make(self, command: str, env: dict[str, str], log: str, args: list[str] | None) -> ServiceProcess:
        service = ServiceProcess(command, {**self.common, **env}, self.tmp_path / log, args=args)
        self.made.append(service)
        return service

    def scheduler(self, args: list[str] | None = None, **env: str) -> ServiceProcess:
        data = {"GPUQUOTA_DATA_DIR": str(self.tmp_path / "sched")}
        return self._make("scheduler", {**self.database, **data, **env}, "scheduler.log", args)

    def gateway(self, port: int, **env: str) -> ServiceProcess:
        env = {**self.database, "GPUQUOTA_PORT": str(port), **env}
        return self._make("gateway", env, "gateway.log", None)

    def node_agent(
        self,
        node_id: str,
        log: str = "agent.log",
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        agent = {
            "GPUQUOTA_NODE_ID": node_id,
            "GPUQUOTA_SLOTS": "ml.g5.xlarge=3",
            "GPUQUOTA_RUNTIME": "simulated",
            "GPUQUOTA_HEARTBEAT_SECONDS": "1",
            "GPUQUOTA_DATA_DIR": str(self.tmp_path / "node"),
        }
        return self._make("node-agent", {**agent, **(env or {})}, log, args)

    async def close(self) -> None:
        for service in self.made:
            print(f"----- {service.command} ({service.log_path.name})\n{service.tail()}")
            if service.proc is not None:
                await service.kill()
