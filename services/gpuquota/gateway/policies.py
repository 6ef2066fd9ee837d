"""Scheduling policies: Create, Update, Describe, List and Delete.

gpuquota schedules with ``quotaSharePolicy`` only; its extensions of a policy travel as tags the AWS
API already carries (``gpuquota:backfill``).
"""

from __future__ import annotations

from typing import Any

from gpuquota.gateway.context import Context
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params, paginate, with_token
from gpuquota.gateway.render import describe_policy
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SchedulingPolicySpec

BACKFILL_TAG = "gpuquota:backfill"


def policy_with_extensions(spec: SchedulingPolicySpec) -> SchedulingPolicySpec:
    """gpuquota's extensions of a scheduling policy travel as tags the AWS API already carries:
    ``gpuquota:backfill=true`` turns on backfill (semantics S3.2)."""
    value = spec.tags.get(BACKFILL_TAG, "false").lower()
    if value not in ("true", "false"):
        raise ClientException(f"Tag {BACKFILL_TAG} must be true or false, not {spec.tags[BACKFILL_TAG]!r}")
    return spec.model_copy(update={"backfill": value == "true"})


def _policy_kind(p: Params) -> None:
    if p.has("fairsharePolicy"):
        if p.has("quotaSharePolicy"):
            raise ClientException("Only one of fairsharePolicy or quotaSharePolicy can be set")
        raise ClientException("fairsharePolicy is not supported: gpuquota schedules with quotaSharePolicy")


async def create(gw: Context, p: Params) -> dict[str, Any]:
    name = p.req_name("name")
    _policy_kind(p)
    spec = policy_with_extensions(SchedulingPolicySpec(name=name, tags=p.tags() or {}))
    await gw.create(gw.rm.policies, spec, inp.CreateSchedulingPolicy)
    return {"name": name, "arn": gw.arns.policy(name)}


async def update(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.policy(p.req_string("arn"))
    if p.has("fairsharePolicy"):
        raise ClientException(
            "Once set, a quotaSharePolicy cannot be removed or changed to a fairsharePolicy"
        )
    _policy_kind(p)
    await gw.update(gw.rm.policies, view.spec.name, view.spec, inp.UpdateSchedulingPolicy)
    return {}


async def describe(gw: Context, p: Params) -> dict[str, Any]:
    refs = p.strs("arns", required=True, max_items=100) or []
    found = []
    for ref in refs:
        parsed = gw.arns.parse(ref) if ref.startswith("arn:") else ("scheduling-policy", (ref,))
        if parsed is not None and parsed[0] == "scheduling-policy" and parsed[1][0] in gw.rm.policies:
            found.append(describe_policy(gw.arns, gw.rm.policies[parsed[1][0]]))
    return {"schedulingPolicies": found}


async def list_all(gw: Context, p: Params) -> dict[str, Any]:
    page, token = paginate(sorted(gw.rm.policies), p)
    return with_token({"schedulingPolicies": [{"arn": gw.arns.policy(n)} for n in page]}, token)


async def delete(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.policy(p.req_string("arn"))
    name = view.spec.name
    message = gw.make(inp.DeleteSchedulingPolicy, name=name)
    await gw.write_resource(gw.rm.policies, name, view.spec, "DELETING", message)
    return {}
