"""The gateway's operator routes (I7): ``/metrics``, ``/health/live``, ``/health/ready`` and ``/console/``.

``install`` registers them through ``Gateway.route_hooks`` (before the catch-all route of the AWS API);
the stack that builds the gateway (``embedded``, ``distributed``) says where the figures come from: the
metrics registry, the readiness probes and the core's state (for the console's nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from gpuquota.gateway.console import Console
from gpuquota.observe.health import Liveness, Probe, add_routes
from gpuquota.observe.metrics import ShareCollector, new_registry

if TYPE_CHECKING:
    from gpuquota.core.state import ClusterState
    from gpuquota.gateway.app import Gateway


def gateway_registry(
    gateway: Gateway, state: Callable[[], ClusterState | None], *collectors: Collector
) -> CollectorRegistry:
    """The gateway's metrics: its read model's shares and counters, the state's pools and nodes, and
    ``collectors`` (the embedded scheduler's timings)."""
    registry = new_registry()
    registry.register(ShareCollector(gateway.rm, state))
    for collector in collectors:
        registry.register(collector)
    return registry


def install(
    gateway: Gateway,
    registry: CollectorRegistry,
    probes: Mapping[str, Probe],
    state: Callable[[], ClusterState | None],
    broken: Liveness | None = None,
) -> None:
    """Serve the operator routes on the gateway's port (``broken``: its liveness check)."""
    console = Console(gateway, state)

    def hook(app: web.Application) -> None:
        add_routes(app.router, registry, probes, broken)
        console.add_routes(app.router)

    gateway.route_hooks.append(hook)
