"""gpuquota's training plan endpoints (S11, not AWS): ``gpuquota apply`` and ``gpuquota plans``.

- ``GET /gpuquota/v1/plans`` lists every plan: its windows, allocations, the window open now, its
  nodes, and its used and idle GPU-hours so far (``gpuquota.read.plans``).
- ``POST /gpuquota/v1/plans`` creates or replaces the plan its body describes (``PutTrainingPlan``)::

      {"trainingPlanName": "p1", "serviceEnvironment": "se", "capacityUnit": "ml.g5.xlarge",
       "count": 2, "windows": [{"start": EPOCH_MS, "end": EPOCH_MS}],
       "allocations": [{"jobQueue": "jq", "quotaShare": "QS1", "count": 1}],
       "gracePeriodSeconds": 120, "tags": {}}

- ``DELETE /gpuquota/v1/plans/{name}`` deletes one (``DeleteTrainingPlan``); an open window closes at
  once, as its end would.

Administrators only (a share-limited key gets ``AccessDenied``): a plan changes every share's capacity.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gpuquota.gateway.access import denied
from gpuquota.gateway.context import Context
from gpuquota.gateway.edge import body_params
from gpuquota.gateway.edge import json_response as _json
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import PLAN_GRACE_SECONDS, PlanAllocation, PlanWindow, TrainingPlanSpec

PATH = "/gpuquota/v1/plans"


def plan_spec(gw: Context, body: Params) -> TrainingPlanSpec:
    """The wire spec of a plan's JSON (a ``ClientException`` naming the bad field)."""
    raw = body.body
    windows = raw.get("windows")
    allocations = raw.get("allocations") or []
    if not isinstance(windows, list) or not isinstance(allocations, list):
        raise ClientException("windows (and allocations, if given) must be lists")
    return gw.build(
        TrainingPlanSpec,
        name=raw.get("trainingPlanName"),
        service_environment=raw.get("serviceEnvironment"),
        unit=raw.get("capacityUnit"),
        count=raw.get("count"),
        windows=tuple(gw.build(PlanWindow, **_fields(w, "windows")) for w in windows),
        allocations=tuple(
            gw.build(
                PlanAllocation,
                job_queue=a.get("jobQueue"),
                quota_share=a.get("quotaShare"),
                count=a.get("count"),
            )
            for a in (_fields(item, "allocations") for item in allocations)
        ),
        grace_seconds=raw.get("gracePeriodSeconds", PLAN_GRACE_SECONDS),
        tags=raw.get("tags") or {},
    )


def _fields(item: Any, what: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ClientException(f"each of {what} must be an object")
    return item


def listing(gw: Context) -> dict[str, Any]:
    return {"trainingPlans": gw.rm.plans.describe(gw.clock())}


async def put(gw: Context, body: Params) -> dict[str, Any]:
    spec = plan_spec(gw, body)
    await gw.send(gw.make(inp.PutTrainingPlan, spec=spec))
    return gw.rm.plans.row(spec.name, gw.clock()) if spec.name in gw.rm.plans.plans else {}


async def delete(gw: Context, name: str) -> dict[str, Any]:
    if name not in gw.rm.plans.plans:
        raise ClientException(f"Training plan {name} does not exist")
    await gw.send(gw.make(inp.DeleteTrainingPlan, name=name))
    return {"trainingPlanName": name, "status": "DELETED"}


class PlanRoutes:
    """Install with ``PlanRoutes(gateway).add_routes(app)`` (``Gateway.app`` does)."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PATH, self._list)
        app.router.add_post(PATH, self._put)
        app.router.add_delete(PATH + "/{name}", self._delete)

    async def _admin(self, request: web.Request, action: str) -> None:
        principal = await self.gateway.limited_principal(request)
        if principal is not None:
            raise denied(principal, action)

    async def _list(self, request: web.Request) -> web.Response:
        await self._admin(request, "gpuquota:ListTrainingPlans")
        return _json(listing(self.gateway))

    async def _put(self, request: web.Request) -> web.Response:
        await self._admin(request, "gpuquota:PutTrainingPlan")
        return _json(await put(self.gateway, body_params(await request.read())))

    async def _delete(self, request: web.Request) -> web.Response:
        await self._admin(request, "gpuquota:DeleteTrainingPlan")
        return _json(await delete(self.gateway, request.match_info["name"]))
