"""Service environments: Create, Update, Describe and Delete.

A service environment draws on the pool named by its ``gpuquota:pool`` tag (semantics S1); a gateway
serves one pool.
"""

from __future__ import annotations

from typing import Any

from gpuquota.gateway.context import Context
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params, paginate, with_token
from gpuquota.gateway.render import describe_environment
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import CapacityLimit, ServiceEnvironmentSpec, State

POOL_TAG = "gpuquota:pool"


def state_change(p: Params) -> dict[str, Any]:
    """``{"state": ...}`` when the request sets a resource's state (ENABLED or DISABLED), else nothing."""
    value = p.string("state")
    return {} if value is None else {"state": State(value)}


def pool_of(gw: Context, tags: dict[str, str]) -> str:
    """S1: a service environment draws on the pool named by its ``gpuquota:pool`` tag."""
    pool = tags.get(POOL_TAG, gw.pool)
    if pool != gw.pool:
        raise ClientException(
            f"This gateway serves pool {gw.pool}; tag {POOL_TAG}={pool} needs a gateway of that pool"
        )
    return pool


def capacity_limit(item: Params) -> CapacityLimit:
    """One ``{capacityUnit, maxCapacity}`` of a request (the spec that holds it checks the rest)."""
    count = item.ranged("maxCapacity", CapacityLimit, "max_capacity", required=True)
    assert count is not None
    return CapacityLimit(unit=item.req_unit(), max_capacity=count)


def _capacity_limits(p: Params, key: str, *, required: bool) -> tuple[CapacityLimit, ...] | None:
    items = p.objs(key, required=required, max_items=100)
    if items is None:
        return None
    if not items:
        raise ClientException(f"{key} must have at least one entry")
    return tuple(capacity_limit(item) for item in items)


def _answer(gw: Context, name: str) -> dict[str, Any]:
    return {"serviceEnvironmentName": name, "serviceEnvironmentArn": gw.arns.environment(name)}


async def create(gw: Context, p: Params) -> dict[str, Any]:
    name = p.req_name("serviceEnvironmentName")
    state = state_change(p).get("state", State.ENABLED)
    limits = _capacity_limits(p, "capacityLimits", required=True) or ()
    tags = p.tags() or {}
    spec = gw.build(
        ServiceEnvironmentSpec,
        name=name,
        state=state,
        capacity_limits=limits,
        pool=pool_of(gw, tags),
        tags=tags,
    )
    await gw.create(gw.rm.environments, spec, inp.CreateServiceEnvironment)
    return _answer(gw, name)


async def update(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.environment(p.req_string("serviceEnvironment"))
    changes = state_change(p)
    if (limits := _capacity_limits(p, "capacityLimits", required=False)) is not None:
        changes["capacity_limits"] = limits
    spec = gw.build(ServiceEnvironmentSpec, **{**view.spec.model_dump(), **changes})
    await gw.update(gw.rm.environments, spec.name, spec, inp.UpdateServiceEnvironment)
    return _answer(gw, spec.name)


async def describe(gw: Context, p: Params) -> dict[str, Any]:
    refs = p.strs("serviceEnvironments", max_items=100)
    names = gw.known(refs, gw.rm.environments, "service-environment", "service environment")
    page, token = paginate(names, p)
    found = [describe_environment(gw.arns, gw.rm.environments[n]) for n in page]
    return with_token({"serviceEnvironments": found}, token)


async def delete(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.environment(p.req_string("serviceEnvironment"))
    message = gw.make(inp.DeleteServiceEnvironment, name=view.spec.name)
    await gw.write_resource(gw.rm.environments, view.spec.name, view.spec, "DELETING", message)
    return {}
