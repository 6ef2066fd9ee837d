"""Running a service as a process: ``serve`` runs one until SIGTERM/SIGINT or its failure, and
``gpuquota gateway`` and ``gpuquota scheduler`` are the gateway's and the scheduler's entry points,
configured by ``GPUQUOTA_*`` variables (``gpuquota.config.settings``; ``gpuquota node-agent``:
``entrypoints.node_agent``). The services themselves are in ``entrypoints.distributed``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpuquota.adapters.kafka import KafkaTopics
from gpuquota.config.settings import GatewaySettings, SchedulerSettings
from gpuquota.core.policy import SchedulingPolicy
from gpuquota.entrypoints.distributed import GatewayService
from gpuquota.entrypoints.metrics_port import scheduler_ops
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.browser_guard import BrowserPolicy
from gpuquota.gateway.node_routes import HttpLogs
from gpuquota.observe.startup import drain, run_service, wait_for_dependencies, warn_unknown_variables
from gpuquota.scheduler.faust_app import SchedulerConfig, SchedulerService
from gpuquota.scheduler.loop import GC_THRESHOLDS

Stoppable = Callable[[], Awaitable[None]]


async def serve(
    start: Stoppable,
    stop: Stoppable,
    ready: Callable[[], str] | str | None = None,
    failed: Awaitable[object] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until ``failed`` resolves to an error (exit 1).

    ``ready`` (a line, or a function giving it once started) is printed when ``start`` returns. A stop
    that takes long logs what it waits for (``startup.drain``).
    """
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(stopping.wait())]
    if failed is not None:
        waiters.append(asyncio.ensure_future(failed))
    try:
        await start()
        if ready is not None:
            print(ready if isinstance(ready, str) else ready(), flush=True)
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        error = next((w.result() for w in done if w is not waiters[0]), None)
        return 1 if error is not None else 0
    finally:
        for waiter in waiters:
            waiter.cancel()
        await drain(stop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def configure_logging(level: str, fmt: str = "text") -> None:
    """Text with timestamps, or JSON (``GPUQUOTA_LOG_FORMAT``): ``gpuquota.observe.logs``."""
    from gpuquota.observe.logs import configure_logging as configure

    configure(level, fmt)


_S = TypeVar("_S", GatewaySettings, SchedulerSettings)


def _settings(command: str, kind: type[_S], environ: dict[str, str] | None) -> _S | None:
    """The service's settings from the environment, its logging configured; None (printed) if invalid."""
    from gpuquota.config.environ import SettingsError

    env = os.environ if environ is None else environ
    warn_unknown_variables(command, env)
    try:
        settings = kind.from_env(env)
    except SettingsError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
    configure_logging(settings.log_level, settings.log_format)
    return settings


def run_gateway(
    environ: dict[str, str] | None = None,
    auth_keys: str | None = None,
    allow_unauthenticated: bool = False,
    allowed_hosts: str | None = None,
    allowed_origins: str | None = None,
) -> int:
    """``gpuquota gateway``: ``auth_keys`` (``--auth-keys``) overrides ``GPUQUOTA_AUTH_KEYS``;
    ``allow_unauthenticated`` (``--allow-unauthenticated``) or its variable lifts the loopback rule;
    ``allowed_hosts`` and ``allowed_origins`` (``--allowed-hosts``, ``--allowed-origins``) override
    ``GPUQUOTA_ALLOWED_HOSTS`` and ``GPUQUOTA_ALLOWED_ORIGINS``."""
    from gpuquota.gateway.auth import load_auth
    from gpuquota.support.exposure import read_token

    settings = _settings("gpuquota gateway", GatewaySettings, environ)
    if settings is None:
        return 2
    path = auth_keys or (None if settings.auth_keys is None else str(settings.auth_keys))
    allow = allow_unauthenticated or settings.allow_unauthenticated
    try:  # before connecting to anything: a refused configuration never reaches the dependencies
        auth = load_auth(path, settings.host, "gpuquota gateway", allow)
        node_token = read_token(settings.node_token, settings.node_token_file)
        browser = BrowserPolicy.parse(
            allowed_hosts or settings.allowed_hosts, allowed_origins or settings.allowed_origins
        )
    except ValueError as exc:  # KeyConfigError, Exposed, TokenError
        print(f"gpuquota gateway: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        await wait_for_dependencies(
            "gpuquota gateway", settings.startup_timeout, settings.kafka, settings.database_url
        )
        service = GatewayService(
            settings.kafka,
            settings.database_url,
            topics=KafkaTopics(settings.topic_prefix),
            pool=settings.pool,
            host=settings.host,
            port=settings.port,
            auth=auth,
            node_logs=HttpLogs(settings.node_logs_url, node_token) if settings.node_logs_url else None,
            browser=browser,
            kafka_security=settings.kafka_security,
            produce_timeout=settings.produce_timeout,
            admission=Admission.of(settings),
        )
        return await serve(service.start, service.stop, lambda: f"gpuquota gateway ready on {service.url}")

    return run_service("gpuquota gateway", main)


def run_scheduler(environ: dict[str, str] | None = None, metrics_port: int | None = None) -> int:
    """``gpuquota scheduler``: ``metrics_port`` (``--metrics-port``) overrides ``GPUQUOTA_METRICS_PORT``."""
    settings = _settings("gpuquota scheduler", SchedulerSettings, environ)
    if settings is None:
        return 2
    port = metrics_port if metrics_port is not None else settings.metrics_port
    config = SchedulerConfig(
        kafka=settings.kafka,
        database_url=settings.database_url,
        topics=KafkaTopics(settings.topic_prefix),
        kafka_security=settings.kafka_security,
        default_pool=settings.pool,
        snapshot_every=settings.snapshot_every,
        tick_seconds=settings.tick_seconds,
        heartbeat_timeout_ms=SchedulingPolicy(
            heartbeat_seconds=settings.heartbeat_seconds
        ).heartbeat_timeout_ms,
        data_dir=settings.data_dir,
        instance_id=settings.instance_id or None,
    )

    async def main() -> int:
        await wait_for_dependencies(
            "gpuquota scheduler", settings.startup_timeout, settings.kafka, settings.database_url
        )
        service = SchedulerService(config)
        ops = None if port is None else scheduler_ops(service, port)

        async def start() -> None:
            if ops is not None:
                await ops.start()  # live at once; ready once the service has started
            await service.start()
            gc.freeze()  # what start-up built (modules, faust, aiokafka) is never garbage

        async def stop() -> None:
            await service.stop()
            if ops is not None:
                await ops.stop()

        return await serve(start, stop, "gpuquota scheduler ready", service.wait())

    gc.set_threshold(*GC_THRESHOLDS)
    return run_service("gpuquota scheduler", main)
