"""``POST /gpuquota/v1/impact``: what a configuration change would do to the jobs, before it is made.

Body: ``{"operations": [{"operation": "UpdateQuotaShare", "request": {...}}, ...]}``, the AWS requests
a change would send, in order (what ``gpuquota apply --dry-run`` would have sent). Only the writes of
configuration are accepted: ``OPERATIONS`` below.

Each operation runs through its own handler (the same checks, the same merge of a partial update with
the current spec) on a ``CaptureContext``: the scheduler inputs it would send are collected, never
sent, and the read model is not touched (the capture writes to copies of its resource tables, where
each write counts as accepted, so a later operation of the same change sees the resource it creates).
The gateway's planner (``Gateway.planner``, given by the gateway front: ``gpuquota.sim.impact`` on a
copy of the scheduler's state) then says what those inputs would do. Nothing is sent to the
scheduler and nothing is logged: the endpoint is read-only. Admin keys only.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpuquota.gateway.access import denied
from gpuquota.gateway.context import Context
from gpuquota.gateway.edge import body_params
from gpuquota.gateway.edge import json_response as _json
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params
from gpuquota.read.model import ResourceView
from gpuquota.wire.inputs import SchedulerInput

if TYPE_CHECKING:
    from gpuquota.gateway.app import Gateway

Planner = Callable[[list[SchedulerInput]], Awaitable[dict[str, Any]]]
"""The inputs of a change -> what they would do (``impact`` of ``apply --dry-run -o json``)."""
PATH = "/gpuquota/v1/impact"
OPERATIONS = frozenset(
    {
        "CreateSchedulingPolicy",
        "CreateServiceEnvironment",
        "UpdateServiceEnvironment",
        "CreateJobQueue",
        "UpdateJobQueue",
        "CreateQuotaShare",
        "UpdateQuotaShare",
    }
)
MAX_OPERATIONS = 100
RESOURCE_TABLES = ("policies", "environments", "queues", "shares")


class CaptureContext(Context):
    """A ``Context`` whose writes are collected (``inputs``) instead of sent."""

    def __init__(self, gw: Context) -> None:
        rm = copy.copy(gw.rm)  # shares the jobs and nodes, which no configuration write touches
        for name in RESOURCE_TABLES:
            setattr(rm, name, dict(getattr(gw.rm, name)))
        super().__init__(rm, gw.port, gw.clock, gw.pool)
        self.inputs: list[SchedulerInput] = []

    async def send(self, message: SchedulerInput) -> None:
        self.inputs.append(message)

    async def write_resource(
        self, table: dict[Any, ResourceView[Any]], key: Any, spec: Any, status: str, message: SchedulerInput
    ) -> None:
        table[key] = ResourceView(spec)
        self.inputs.append(message)


async def capture(gw: Gateway, body: Params) -> list[SchedulerInput]:
    """The scheduler inputs that the body's operations would send, in order."""
    operations = body.objs("operations", required=True) or []
    if len(operations) > MAX_OPERATIONS:
        raise ClientException(f"operations: at most {MAX_OPERATIONS} per request")
    context = CaptureContext(gw)
    for index, item in enumerate(operations):
        name = item.req_string("operation")
        if name not in OPERATIONS:
            allowed = ", ".join(sorted(OPERATIONS))
            raise ClientException(f"operations[{index}].operation must be one of {allowed}")
        request = item.obj("request", required=True)
        assert request is not None
        try:
            await gw.table[name.lower()].handler(context, request)
        except ClientException as exc:
            raise ClientException(f"operations[{index}] ({name}): {exc}") from None
    return context.inputs


class ImpactRoute:
    """The route, installed through ``Gateway.route_hooks`` (``install``)."""

    def __init__(self, gateway: Gateway, planner: Planner) -> None:
        self.gateway = gateway
        self.planner = planner

    def install(self) -> None:
        self.gateway.route_hooks.append(self.add_route)

    def add_route(self, app: web.Application) -> None:
        app.router.add_post(PATH, self._impact)

    async def _impact(self, request: web.Request) -> web.Response:
        principal = await self.gateway.limited_principal(request)
        if principal is not None:
            raise denied(principal, "gpuquota:PlanImpact")
        inputs = await capture(self.gateway, body_params(await request.read()))
        return _json({"impact": await self.planner(inputs)})
