"""The gateway's front, as both assemblies (``embedded``, ``distributed``) start and stop it: its HTTP
listener, the browser guard of that listener (``gpuquota.gateway.browser_guard``: which ``Host`` and
``Origin`` values it answers) and the start-estimate explainer that its ``explain`` answers with
(``gpuquota.sim.explainer``), whose sweeps run only while the gateway listens."""

from __future__ import annotations

from collections.abc import Callable

from gpuquota.core import ClusterState
from gpuquota.gateway import Gateway
from gpuquota.gateway.browser_guard import BrowserGuard, BrowserPolicy
from gpuquota.httpserver import HttpServer
from gpuquota.readmodel import ReadModel
from gpuquota.sim.explainer import EstimatingExplainer


class GatewayFront:
    """Give ``explainer`` and ``guard`` to the ``Gateway``, then :meth:`serve` it; ``port`` 0 picks a
    free port."""

    def __init__(
        self,
        host: str,
        port: int,
        state: Callable[[], ClusterState],
        read_model: ReadModel,
        clock: Callable[[], int],
        browser: BrowserPolicy | None = None,
    ) -> None:
        self.server = HttpServer(host, port)
        self.guard = BrowserGuard(host, browser)
        self.explainer = EstimatingExplainer(state, read_model, clock)

    async def serve(self, gateway: Gateway) -> int:
        """Keep the estimates ahead and listen; the port it listens on."""
        self.explainer.start()
        await self.server.serve(gateway.app())
        return self.server.port

    async def stop(self) -> None:
        await self.server.stop()
        await self.explainer.stop()
