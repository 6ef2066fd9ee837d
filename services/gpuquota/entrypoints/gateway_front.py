"""The gateway's front, as both assemblies (``embedded``, ``distributed``) start and stop it: its HTTP
listener, the browser guard of that listener (``gpuquota.gateway.browser_guard``: which ``Host`` and
``Origin`` values it answers) and the start-estimate explainer that its ``explain`` answers with
(``gpuquota.sim.explainer``), whose sweeps run only while the gateway listens, and the planner of
``POST /gpuquota/v1/impact`` (``gpuquota.gateway.dry_run``): ``gpuquota.sim.impact`` on a copy of the
state, in a worker thread, so that a deep queue's forward runs never hold up the state's own loop."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

from gpuquota.core import ClusterState
from gpuquota.gateway import Gateway
from gpuquota.gateway.browser_guard import BrowserGuard, BrowserPolicy
from gpuquota.gateway.dry_run import ImpactRoute
from gpuquota.read.model import ReadModel
from gpuquota.sim.background import pickled
from gpuquota.sim.estimate import EndOf, likely_end, observed_medians
from gpuquota.sim.explainer import EstimatingExplainer
from gpuquota.sim.impact import impact
from gpuquota.support.httpserver import HttpServer
from gpuquota.wire.inputs import SchedulerInput


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
        self.state = state
        self.read_model = read_model
        self.clock = clock
        self.explainer = EstimatingExplainer(state, read_model, clock)

    async def plan(self, inputs: list[SchedulerInput]) -> dict[str, Any]:
        """What ``inputs`` would do: the state is copied here, on the thread that owns it, and the
        copy is run forward in a worker thread (start estimates' *likely* ends)."""
        copy, now = pickled(self.state()), self.clock()
        end_of = likely_end(observed_medians(self.read_model))
        return await asyncio.to_thread(_impact_of, copy, inputs, now, end_of)

    async def serve(self, gateway: Gateway) -> int:
        """Keep the estimates ahead and listen; the port it listens on."""
        ImpactRoute(gateway, self.plan).install()
        self.explainer.start()
        await self.server.serve(gateway.app())
        return self.server.port

    async def stop(self) -> None:
        await self.server.stop()
        await self.explainer.stop()


def _impact_of(copy: bytes, inputs: list[SchedulerInput], now: int, end_of: EndOf) -> dict[str, Any]:
    return impact(pickle.loads(copy), inputs, now, end_of).as_json()
