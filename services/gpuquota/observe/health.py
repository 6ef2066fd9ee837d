"""``/health/live``, ``/health/ready`` and ``/metrics`` (I7), and the small HTTP server that serves them for
the scheduler and the node agents (``--metrics-port``; the gateway serves them on its own port).

Live means the process answers and nothing in it broke for good (a ``Liveness`` check, e.g. the
gateway's read model that cannot be rebuilt from the log: 503 with the reason). Ready means it can do
its job: each probe (event log, broker, read model, ...) answers within ``PROBE_TIMEOUT`` seconds with
``None`` (fine) or a sentence saying what is wrong. The body lists every probe, so ``curl
/health/ready`` says what is not ready; the status is 200 when all are fine, 503 otherwise (what
Kubernetes' readiness probe reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuquota.adapters.event_store import TransientStoreError
from gpuquota.observe.metrics import CONTENT_TYPE, exposition
from gpuquota.support.httpserver import HttpServer

if TYPE_CHECKING:
    from gpuquota.adapters.event_store import EventStore

Probe = Callable[[], Awaitable[str | None]]
"""``None`` when the dependency is fine, else a sentence saying what is wrong."""

PROBE_TIMEOUT = 3.0
READ_MODEL_MAX_LAG = 100
"""A read model at most this many log records behind is caught up (it folds every 20 ms)."""


async def readiness(
    probes: Mapping[str, Probe], timeout: float = PROBE_TIMEOUT
) -> tuple[bool, dict[str, str]]:
    """Run every probe at once; ``(all fine, {probe: "ok" or what is wrong})``."""

    async def run(probe: Probe) -> str | None:
        try:
            return await asyncio.wait_for(probe(), timeout)
        except TimeoutError:
            return f"no answer within {timeout:g} s"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    results = await asyncio.gather(*(run(probe) for probe in probes.values()))
    checks = {name: "ok" if result is None else result for name, result in zip(probes, results, strict=True)}
    return all(result is None for result in results), checks


def store_probe(
    store: Callable[[], EventStore | None], pool: str, refused: Callable[[], str | None] | None = None
) -> Probe:
    """The event log answers a query (``last_seq`` of ``pool``) and, with ``refused`` (the embedded
    shell's ``write_failure``), takes writes: a log that reads but refuses writes is not ready."""

    async def probe() -> str | None:
        current = store()
        if current is None:
            return "not connected"
        try:
            await current.last_seq(pool)
        except TransientStoreError as exc:  # the readiness says which dependency is missing
            return f"the database (event log) is unreachable: {exc}"
        failure = refused() if refused is not None else None
        if failure is not None:
            return f"the event log cannot be written: {failure}; writes are refused until one succeeds"
        return None

    return probe


def broker_probe(bootstrap: str) -> Probe:
    """A bootstrap server of the Kafka cluster accepts a TCP connection."""
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]

    async def probe() -> str | None:
        problems = []
        for server in servers:
            host, _, port = server.rpartition(":")
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), PROBE_TIMEOUT / 2
                )
            except (OSError, TimeoutError) as exc:
                problems.append(f"{server}: {exc or type(exc).__name__}")
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return None
        return "Kafka unreachable at " + "; ".join(problems)

    return probe


def lag_probe(lag: Callable[[], Awaitable[int]], most: int = READ_MODEL_MAX_LAG) -> Probe:
    """The read model is at most ``most`` log records behind."""

    async def probe() -> str | None:
        behind = await lag()
        return None if behind <= most else f"{behind} log records behind"

    return probe


def flag_probe(check: Callable[[], str | None]) -> Probe:
    """A probe of what the process knows already (no I/O)."""

    async def probe() -> str | None:
        return check()

    return probe


Liveness = Callable[[], str | None]
"""``None`` while the process does its work, else a sentence saying what broke for good (``/health/live``
answers 503: only a restart helps, e.g. a read model that cannot be rebuilt from the log)."""


def add_routes(
    router: web.UrlDispatcher,
    registry: CollectorRegistry,
    probes: Mapping[str, Probe],
    broken: Liveness | None = None,
) -> None:
    """``GET /metrics``, ``/health/live`` and ``/health/ready`` on ``router``."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE})

    async def live(_: web.Request) -> web.Response:
        if broken is not None and (why := broken()) is not None:
            return _json({"status": "not live", "reason": why}, 503)
        return _json({"status": "live"})

    async def ready(_: web.Request) -> web.Response:
        ok, checks = await readiness(probes)
        return _json({"status": "ready" if ok else "not ready", "checks": checks}, 200 if ok else 503)

    router.add_get("/metrics", metrics)
    router.add_get("/health/live", live)
    router.add_get("/health/ready", ready)


def _json(body: dict[str, object], status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


async def _ok(_: web.Request) -> web.Response:
    return _json({"status": "ok"})


class OpsServer(HttpServer):
    """``/metrics``, ``/health``, ``/health/live`` and ``/health/ready`` on their own port."""

    def __init__(
        self, registry: CollectorRegistry, probes: Mapping[str, Probe], host: str, port: int
    ) -> None:
        super().__init__(host, port)
        self.app = web.Application()
        add_routes(self.app.router, registry, probes)
        self.app.router.add_get("/health", _ok)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await self.serve(self.app)
