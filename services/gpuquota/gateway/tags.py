"""TagResource, UntagResource and ListTagsForResource (``/v1/tags/{arn}``) for every resource kind.

A resource's tags are part of its spec, so retagging one is an update of the whole spec (with the
checks its tags carry: the pool of a service environment, the extensions of a scheduling policy); a
job's tags travel as ``TagJob``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from gpuquota.gateway.context import Context
from gpuquota.gateway.environments import pool_of
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params, check_tags
from gpuquota.gateway.policies import policy_with_extensions
from gpuquota.read.jobs import JobView
from gpuquota.read.model import ResourceView
from gpuquota.wire import inputs as inp

Target = JobView | ResourceView[Any]


def _tagged(gw: Context, arn: str) -> tuple[str, Target]:
    parsed = gw.arns.parse(unquote(arn))
    if parsed is None:
        raise ClientException(f"{arn} is not a taggable resource ARN")
    kind, names = parsed
    if kind == "scheduling-policy":
        return kind, gw.policy(names[0])
    if kind == "service-environment":
        return kind, gw.environment(names[0])
    if kind == "job-queue":
        return kind, gw.queue(names[0])
    if kind == "quota-share":
        return kind, gw.share(unquote(arn))
    return kind, gw.job(names[0])


async def _retag(gw: Context, arn: str, change: Callable[[dict[str, str]], dict[str, str]]) -> None:
    kind, target = _tagged(gw, arn)
    if isinstance(target, JobView):
        target.tags = check_tags(change(dict(target.tags)))
        return await gw.send(gw.make(inp.TagJob, job_id=target.job_id, tags=target.tags))
    spec = target.spec.model_copy(update={"tags": check_tags(change(dict(target.spec.tags)))})
    if kind == "scheduling-policy":
        await gw.update(gw.rm.policies, spec.name, policy_with_extensions(spec), inp.UpdateSchedulingPolicy)
    elif kind == "service-environment":
        pool_of(gw, spec.tags)
        await gw.update(gw.rm.environments, spec.name, spec, inp.UpdateServiceEnvironment)
    elif kind == "job-queue":
        await gw.update(gw.rm.queues, spec.name, spec, inp.UpdateJobQueue)
    else:
        await gw.update(gw.rm.shares, (spec.job_queue, spec.name), spec, inp.UpdateQuotaShare)


async def tag_resource(gw: Context, arn: str, p: Params) -> dict[str, Any]:
    new = p.tags()
    if not new:
        raise ClientException("Missing required parameter: tags")
    await _retag(gw, arn, lambda tags: {**tags, **new})
    return {}


async def untag_resource(gw: Context, arn: str, keys: list[str]) -> dict[str, Any]:
    if not keys:
        raise ClientException("Missing required parameter: tagKeys")
    await _retag(gw, arn, lambda tags: {k: v for k, v in tags.items() if k not in keys})
    return {}


async def list_tags(gw: Context, arn: str) -> dict[str, Any]:
    _, target = _tagged(gw, arn)
    if isinstance(target, JobView):
        return {"tags": dict(target.tags)}
    return {"tags": dict(target.spec.tags)}
