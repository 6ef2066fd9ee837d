"""Job queues: Create, Update, Describe, Delete and GetJobQueueSnapshot.

A gpuquota job queue has one service environment and a quota share scheduling policy.
"""

from __future__ import annotations

from typing import Any

from gpuquota.core.blocked import BLOCKED_CODES
from gpuquota.gateway.context import Context
from gpuquota.gateway.environments import state_change
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params, paginate, with_token
from gpuquota.gateway.render import describe_queue, snapshot
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobQueueSpec, State, TimeLimitAction


def _time_limits(p: Params) -> tuple[TimeLimitAction, ...] | None:
    items = p.objs("jobStateTimeLimitActions", max_items=5)
    if items is None:
        return None
    actions = []
    for item in items:
        if item.req_string("action") != "TERMINATE":
            raise ClientException(
                "The only jobStateTimeLimitActions action of SAGEMAKER_TRAINING queues is TERMINATE"
            )
        actions.append(
            TimeLimitAction(
                reason=item.req_enum("reason", BLOCKED_CODES),
                max_time_seconds=item.req_integer("maxTimeSeconds", low=600, high=86400),
            )
        )
    return tuple(actions)


def _environment_order(gw: Context, p: Params, required: bool) -> str | None:
    if p.has("computeEnvironmentOrder"):
        raise ClientException("computeEnvironmentOrder is not supported: use serviceEnvironmentOrder")
    items = p.objs("serviceEnvironmentOrder", required=required)
    if items is None:
        return None
    if len(items) != 1:
        raise ClientException("A job queue must have exactly one service environment")
    items[0].req_integer("order", low=0)
    return gw.environment(items[0].req_string("serviceEnvironment")).spec.name


def _answer(gw: Context, name: str) -> dict[str, Any]:
    return {"jobQueueName": name, "jobQueueArn": gw.arns.queue(name)}


async def create(gw: Context, p: Params) -> dict[str, Any]:
    name = p.req_name("jobQueueName")
    state = state_change(p).get("state", State.ENABLED)
    priority = p.ranged("priority", JobQueueSpec, "priority", required=True)
    assert priority is not None
    p.enum("jobQueueType", ("SAGEMAKER_TRAINING",))
    policy_ref = p.string("schedulingPolicyArn")
    if policy_ref is None:
        raise ClientException("schedulingPolicyArn is required: gpuquota job queues use a quota share policy")
    policy = gw.policy(policy_ref).spec.name
    environment = _environment_order(gw, p, required=True)
    assert environment is not None
    spec = JobQueueSpec(
        name=name,
        state=state,
        priority=priority,
        service_environment=environment,
        scheduling_policy=policy,
        time_limit_actions=_time_limits(p) or (),
        tags=p.tags() or {},
    )
    await gw.create(gw.rm.queues, spec, inp.CreateJobQueue)
    return _answer(gw, name)


async def update(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.queue(p.req_string("jobQueue"))
    changes = state_change(p)
    if (priority := p.ranged("priority", JobQueueSpec, "priority")) is not None:
        changes["priority"] = priority
    if (policy_ref := p.string("schedulingPolicyArn")) is not None:
        changes["scheduling_policy"] = gw.policy(policy_ref).spec.name
    if (environment := _environment_order(gw, p, required=False)) is not None:
        changes["service_environment"] = environment
    if (actions := _time_limits(p)) is not None:
        changes["time_limit_actions"] = actions
    spec = view.spec.model_copy(update=changes)
    await gw.update(gw.rm.queues, spec.name, spec, inp.UpdateJobQueue)
    return _answer(gw, spec.name)


async def describe(gw: Context, p: Params) -> dict[str, Any]:
    names = gw.known(p.strs("jobQueues", max_items=100), gw.rm.queues, "job-queue", "job queue")
    page, token = paginate(names, p)
    return with_token({"jobQueues": [describe_queue(gw.arns, gw.rm.queues[n]) for n in page]}, token)


async def delete(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.queue(p.req_string("jobQueue"))
    message = gw.make(inp.DeleteJobQueue, name=view.spec.name)
    await gw.write_resource(gw.rm.queues, view.spec.name, view.spec, "DELETING", message)
    return {}


async def get_snapshot(gw: Context, p: Params) -> dict[str, Any]:
    view = gw.queue(p.req_string("jobQueue"))
    return snapshot(gw.rm, view.spec.name, gw.clock())
