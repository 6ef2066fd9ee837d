"""Quota shares: Create, Update, Describe, List and Delete."""

from __future__ import annotations

from typing import Any

from gpuquota.gateway.context import Context
from gpuquota.gateway.environments import capacity_limit, state_change
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params, paginate, with_token
from gpuquota.gateway.render import describe_share
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    MAX_SHARE_LIMITS,
    MIN_SHARE_LIMITS,
    UNLIMITED_BORROW,
    CapacityLimit,
    QuotaShareSpec,
    State,
    Strategy,
)


def _limits(p: Params, required: bool) -> tuple[CapacityLimit, ...] | None:
    items = p.objs("capacityLimits", required=required)
    if items is None:
        return None
    if not MIN_SHARE_LIMITS <= len(items) <= MAX_SHARE_LIMITS:
        raise ClientException(
            f"A quota share must have between {MIN_SHARE_LIMITS} and {MAX_SHARE_LIMITS} capacity limits"
        )
    return tuple(capacity_limit(item) for item in items)


def _sharing(p: Params, required: bool) -> tuple[Strategy, int | None] | None:
    sharing = p.obj("resourceSharingConfiguration", required=required)
    if sharing is None:
        return None
    strategy = Strategy(sharing.req_string("strategy"))
    return strategy, sharing.ranged("borrowLimit", QuotaShareSpec, "borrow_limit")


def _in_share(p: Params, required: bool) -> bool | None:
    config = p.obj("preemptionConfiguration", required=required)
    if config is None:
        return None
    return config.req_string("inSharePreemption") == "ENABLED"


def _answer(gw: Context, queue: str, name: str) -> dict[str, Any]:
    return {"quotaShareName": name, "quotaShareArn": gw.arns.share(queue, name)}


async def create(gw: Context, p: Params) -> dict[str, Any]:
    name = p.req_name("quotaShareName")
    queue = gw.queue(p.req_string("jobQueue"))
    limits = _limits(p, required=True)
    sharing = _sharing(p, required=True)
    in_share = _in_share(p, required=True)
    state = state_change(p).get("state", State.ENABLED)
    tags = p.tags() or {}
    assert limits is not None and sharing is not None and in_share is not None
    queue_name = queue.spec.name
    if queue.status != "VALID":
        raise ClientException(
            f"Job queue {queue_name} is {queue.status}: quota shares need a VALID job queue"
        )
    if (queue_name, name) in gw.rm.shares:
        raise ClientException(f"Quota share {name} already exists in job queue {queue_name}")
    strategy, borrow = sharing
    spec = gw.build(
        QuotaShareSpec,
        name=name,
        job_queue=queue_name,
        capacity_limits=limits,
        strategy=strategy,
        borrow_limit=UNLIMITED_BORROW if borrow is None else borrow,
        in_share_preemption=in_share,
        state=state,
        tags=tags,
    )
    message = gw.make(inp.CreateQuotaShare, spec=spec)
    await gw.write_resource(gw.rm.shares, (queue_name, name), spec, "CREATING", message)
    return _answer(gw, queue_name, name)


async def update(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.share(p.req_string("quotaShareArn"))
    changes: dict[str, Any] = {}
    if (limits := _limits(p, required=False)) is not None:
        changes["capacity_limits"] = limits
    if (sharing := _sharing(p, required=False)) is not None:
        changes["strategy"], borrow = sharing
        changes["borrow_limit"] = UNLIMITED_BORROW if borrow is None else borrow
    if (in_share := _in_share(p, required=False)) is not None:
        changes["in_share_preemption"] = in_share
    changes.update(state_change(p))
    spec = gw.build(QuotaShareSpec, **{**view.spec.model_dump(), **changes})
    if view.status == "DELETING":
        raise ClientException(f"Quota share {spec.name} is being deleted")
    await gw.update(gw.rm.shares, (spec.job_queue, spec.name), spec, inp.UpdateQuotaShare)
    return _answer(gw, spec.job_queue, spec.name)


async def describe(gw: Context, p: Params) -> dict[str, Any]:
    return describe_share(gw.arns, gw.share(p.req_string("quotaShareArn")))


async def list_all(gw: Context, p: Params) -> dict[str, Any]:
    queue = gw.queue(p.req_string("jobQueue")).spec.name
    keys = sorted(k for k in gw.rm.shares if k[0] == queue)
    page, token = paginate(keys, p)
    found = [describe_share(gw.arns, gw.rm.shares[k], with_tags=False) for k in page]
    return with_token({"quotaShares": found}, token)


async def delete(gw: Context, p: Params) -> dict[str, Any]:
    spec = gw.share(p.req_string("quotaShareArn")).spec
    message = gw.make(inp.DeleteQuotaShare, job_queue=spec.job_queue, name=spec.name)
    await gw.write_resource(gw.rm.shares, (spec.job_queue, spec.name), spec, "DELETING", message)
    return {}
