"""The AWS Batch REST-JSON gateway (interface I2): aiohttp handlers for the quota-management subset.

Theory of operation
-------------------
Every operation is ``POST /v1/<operation in lower case>`` with a JSON body (tags: ``/v1/tags/{arn}``
with POST, GET and DELETE), exactly as botocore's ``batch`` model sends them. A handler validates the
body against AWS's rules, reads from the ``ReadModel`` and turns writes into scheduler inputs sent
through the ``CommandPort``. AWS updates are partial; the gateway merges them with the current spec
from the read model, so the scheduler always receives a whole spec.

Before sending a write the gateway records the resource's pending status in the read model
(``CREATING``, ``UPDATING``, ``DELETING``, a job ``SUBMITTED``), so reading right after writing never
answers "does not exist"; a rejection by the core restores the previous view and becomes a
``ClientException`` carrying the core's reason.

Errors: ``ClientException`` (HTTP 400) and ``ServerException`` (HTTP 500), with the header
``x-amzn-ErrorType`` and the body ``{"message": ...}``, which botocore turns into ``ClientError``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote

from aiohttp import web
from pydantic import BaseModel, ValidationError

from gpuquota.arns import ArnFactory
from gpuquota.clock import Clock, wall_clock_ms
from gpuquota.core.blocked import BLOCKED_CODES
from gpuquota.core.explain import Explanation
from gpuquota.gateway.auth import AccessDenied, Keyring, Principal, SignedRequest, verify
from gpuquota.gateway.edge import body_params as _body
from gpuquota.gateway.edge import errors as _errors
from gpuquota.gateway.edge import json_response as _json
from gpuquota.gateway.edge import parse_json
from gpuquota.gateway.edge import uuid4 as _uuid4
from gpuquota.gateway.edge import validation_message as _validation_message
from gpuquota.gateway.errors import ApiError, ClientException
from gpuquota.gateway.params import Params, check_tags, paginate
from gpuquota.gateway.ports import CommandPort, CommandRejected
from gpuquota.readmodel import JobView, ReadModel, ResourceView
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    CapacityLimit,
    ExitRule,
    JobQueueSpec,
    JobSpec,
    JobStatus,
    Message,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    State,
    Strategy,
    TimeLimitAction,
)
from gpuquota.wire.inputs import SchedulerInput

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
B = TypeVar("B", bound=BaseModel)
S = TypeVar("S", SchedulingPolicySpec, ServiceEnvironmentSpec, JobQueueSpec, QuotaShareSpec)
Operation = Callable[[Params], Awaitable[dict[str, Any]]]
Explainer = Callable[[str], Explanation | None]
"""``gpuquota.core.explain.explain`` bound to the scheduler's state (embedded mode)."""

MAX_SHARES_PER_QUEUE = 20
MAX_PAYLOAD_BYTES = 10 * 1024
MAX_SUBMIT_BYTES = 30 * 1024
MAX_TERMINATE_JOBS = 50
MAX_BODY_BYTES = 1024 * 1024
STATES = ("ENABLED", "DISABLED")
JOB_STATUSES = tuple(s.value for s in JobStatus)
FILTERS = ("JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT", "SHARE_IDENTIFIER", "QUOTA_SHARE_NAME")


def _state(value: str | None, default: State) -> State:
    return default if value is None else State(value)


class Gateway:
    """The operations of I2 over a read model and a command port."""

    def __init__(
        self,
        read_model: ReadModel,
        port: CommandPort,
        *,
        clock: Clock = wall_clock_ms,
        pool: str = "default",
        explainer: Explainer | None = None,
        auth: Keyring | None = None,
    ) -> None:
        self.rm = read_model
        self.port = port
        self.clock = clock
        self.pool = pool
        self.explainer = explainer
        self.auth = auth
        self.route_hooks: list[Callable[[web.Application], None]] = []  # /metrics, /health/*, /console/
        self.operation_names = {
            name.lower(): name
            for name in (
                "CreateSchedulingPolicy",
                "UpdateSchedulingPolicy",
                "DescribeSchedulingPolicies",
                "ListSchedulingPolicies",
                "DeleteSchedulingPolicy",
                "CreateServiceEnvironment",
                "UpdateServiceEnvironment",
                "DescribeServiceEnvironments",
                "DeleteServiceEnvironment",
                "CreateJobQueue",
                "UpdateJobQueue",
                "DescribeJobQueues",
                "DeleteJobQueue",
                "GetJobQueueSnapshot",
                "CreateQuotaShare",
                "UpdateQuotaShare",
                "DescribeQuotaShare",
                "ListQuotaShares",
                "DeleteQuotaShare",
                "SubmitServiceJob",
                "UpdateServiceJob",
                "DescribeServiceJob",
                "ListServiceJobs",
                "TerminateServiceJob",
                "TerminateServiceJobs",
            )
        }
        self.operations: dict[str, Operation] = {
            lower: getattr(self, f"op_{name}") for lower, name in self.operation_names.items()
        }

    @property
    def arns(self) -> ArnFactory:
        return self.rm.arns

    # ----- plumbing ----------------------------------------------------------------------------

    def make(self, kind: type[M], **fields: Any) -> M:
        try:
            return kind(event_id=_uuid4(), occurred_at=self.clock(), **fields)
        except ValidationError as exc:
            raise ClientException(_validation_message(exc)) from None

    async def _send(self, message: SchedulerInput) -> None:
        try:
            await self.port.send(message)
        except CommandRejected as exc:
            raise ClientException(exc.reason) from None

    async def _write_resource(
        self, table: dict[Any, ResourceView[S]], key: Any, spec: S, status: str, message: SchedulerInput
    ) -> None:
        self.rm.mark(table, key, spec, status, message.event_id)
        try:
            await self._send(message)
        except BaseException:
            self.rm.revert(table, key, message.event_id)
            raise

    def _ref(self, ref: str, kind: str, what: str) -> tuple[str, ...]:
        if ref.startswith("arn:"):
            parsed = self.arns.parse(ref)
            if parsed is None or parsed[0] != kind:
                raise ClientException(f"{ref} is not a valid {what} ARN")
            return parsed[1]
        return (ref,)

    def _policy(self, ref: str) -> ResourceView[SchedulingPolicySpec]:
        (name,) = self._ref(ref, "scheduling-policy", "scheduling policy")
        view = self.rm.policies.get(name)
        if view is None:
            raise ClientException(f"Scheduling policy {ref} does not exist")
        return view

    def _environment(self, ref: str) -> ResourceView[ServiceEnvironmentSpec]:
        (name,) = self._ref(ref, "service-environment", "service environment")
        view = self.rm.environments.get(name)
        if view is None:
            raise ClientException(f"Service environment {ref} does not exist")
        return view

    def _queue(self, ref: str) -> ResourceView[JobQueueSpec]:
        (name,) = self._ref(ref, "job-queue", "job queue")
        view = self.rm.queues.get(name)
        if view is None:
            raise ClientException(f"Job queue {ref} does not exist")
        return view

    def _share(self, arn: str) -> ResourceView[QuotaShareSpec]:
        parsed = self.arns.parse(arn)
        if parsed is None or parsed[0] != "quota-share":
            raise ClientException(f"{arn} is not a valid quota share ARN")
        view = self.rm.shares.get((parsed[1][0], parsed[1][1]))
        if view is None:
            raise ClientException(f"Quota share {arn} does not exist")
        return view

    def _job(self, ref: str) -> JobView:
        (job_id,) = self._ref(ref, "service-job", "service job")
        job = self.rm.jobs.get(job_id)
        if job is None:
            raise ClientException(f"Service job {ref} does not exist")
        return job

    # ----- scheduling policies -----------------------------------------------------------------

    def _policy_kind(self, p: Params) -> None:
        if p.has("fairsharePolicy"):
            if p.has("quotaSharePolicy"):
                raise ClientException("Only one of fairsharePolicy or quotaSharePolicy can be set")
            raise ClientException(
                "fairsharePolicy is not supported: gpuquota schedules with quotaSharePolicy"
            )
        if (qsp := p.obj("quotaSharePolicy")) is not None:
            qsp.enum("idleResourceAssignmentStrategy", ("FIFO",), required=True)

    def _pool_of(self, tags: dict[str, str]) -> str:
        """S1: a service environment draws on the pool named by its ``gpuquota:pool`` tag."""
        pool = tags.get(POOL_TAG, self.pool)
        if pool != self.pool:
            raise ClientException(
                f"This gateway serves pool {self.pool}; tag {POOL_TAG}={pool} needs a gateway of that pool"
            )
        return pool

    async def op_CreateSchedulingPolicy(self, p: Params) -> dict[str, Any]:
        name = p.req_name("name")
        self._policy_kind(p)
        spec = policy_with_extensions(SchedulingPolicySpec(name=name, tags=p.tags() or {}))
        if name in self.rm.policies:
            raise ClientException("Object already exists")
        message = self.make(inp.CreateSchedulingPolicy, spec=spec)
        await self._write_resource(self.rm.policies, name, spec, "CREATING", message)
        return {"name": name, "arn": self.arns.policy(name)}

    async def op_UpdateSchedulingPolicy(self, p: Params) -> dict[str, Any]:
        view = self._policy(p.req_string("arn"))
        if p.has("fairsharePolicy"):
            raise ClientException(
                "Once set, a quotaSharePolicy cannot be removed or changed to a fairsharePolicy"
            )
        self._policy_kind(p)
        message = self.make(inp.UpdateSchedulingPolicy, spec=view.spec)
        await self._write_resource(self.rm.policies, view.spec.name, view.spec, "UPDATING", message)
        return {}

    async def op_DescribeSchedulingPolicies(self, p: Params) -> dict[str, Any]:
        refs = p.strs("arns", required=True, max_items=100) or []
        found = []
        for ref in refs:
            parsed = self.arns.parse(ref) if ref.startswith("arn:") else ("scheduling-policy", (ref,))
            if parsed is not None and parsed[0] == "scheduling-policy" and parsed[1][0] in self.rm.policies:
                found.append(self.rm.describe_policy(self.rm.policies[parsed[1][0]]))
        return {"schedulingPolicies": found}

    async def op_ListSchedulingPolicies(self, p: Params) -> dict[str, Any]:
        page, token = paginate(sorted(self.rm.policies), p)
        out: dict[str, Any] = {"schedulingPolicies": [{"arn": self.arns.policy(n)} for n in page]}
        if token:
            out["nextToken"] = token
        return out

    async def op_DeleteSchedulingPolicy(self, p: Params) -> dict[str, Any]:
        view = self._policy(p.req_string("arn"))
        name = view.spec.name
        message = self.make(inp.DeleteSchedulingPolicy, name=name)
        await self._write_resource(self.rm.policies, name, view.spec, "DELETING", message)
        return {}

    # ----- service environments ----------------------------------------------------------------

    def _capacity_limits(self, p: Params, key: str, *, required: bool) -> tuple[CapacityLimit, ...] | None:
        items = p.objs(key, required=required, max_items=100)
        if items is None:
            return None
        if not items:
            raise ClientException(f"{key} must have at least one entry")
        limits = []
        for item in items:
            limits.append(
                CapacityLimit(unit=item.req_unit(), max_capacity=item.req_integer("maxCapacity", low=0))
            )
        units = [c.unit for c in limits]
        if len(set(units)) != len(units):
            raise ClientException(f"{key} lists a capacityUnit more than once")
        return tuple(limits)

    async def op_CreateServiceEnvironment(self, p: Params) -> dict[str, Any]:
        name = p.req_name("serviceEnvironmentName")
        p.enum("serviceEnvironmentType", ("SAGEMAKER_TRAINING",), required=True)
        state = _state(p.enum("state", STATES), State.ENABLED)
        limits = self._capacity_limits(p, "capacityLimits", required=True) or ()
        tags = p.tags() or {}
        spec = ServiceEnvironmentSpec(
            name=name, state=state, capacity_limits=limits, pool=self._pool_of(tags), tags=tags
        )
        if name in self.rm.environments:
            raise ClientException("Object already exists")
        message = self.make(inp.CreateServiceEnvironment, spec=spec)
        await self._write_resource(self.rm.environments, name, spec, "CREATING", message)
        return {"serviceEnvironmentName": name, "serviceEnvironmentArn": self.arns.environment(name)}

    async def op_UpdateServiceEnvironment(self, p: Params) -> dict[str, Any]:
        view = self._environment(p.req_string("serviceEnvironment"))
        changes: dict[str, Any] = {}
        if (state := p.enum("state", STATES)) is not None:
            changes["state"] = State(state)
        if (limits := self._capacity_limits(p, "capacityLimits", required=False)) is not None:
            changes["capacity_limits"] = limits
        spec = view.spec.model_copy(update=changes)
        message = self.make(inp.UpdateServiceEnvironment, spec=spec)
        await self._write_resource(self.rm.environments, spec.name, spec, "UPDATING", message)
        return {
            "serviceEnvironmentName": spec.name,
            "serviceEnvironmentArn": self.arns.environment(spec.name),
        }

    async def op_DescribeServiceEnvironments(self, p: Params) -> dict[str, Any]:
        refs = p.strs("serviceEnvironments", max_items=100)
        if refs:
            names = []
            for ref in refs:
                (name,) = self._ref(ref, "service-environment", "service environment")
                if name in self.rm.environments and name not in names:
                    names.append(name)
        else:
            names = sorted(self.rm.environments)
        page, token = paginate(names, p)
        out: dict[str, Any] = {
            "serviceEnvironments": [self.rm.describe_environment(self.rm.environments[n]) for n in page]
        }
        if token:
            out["nextToken"] = token
        return out

    async def op_DeleteServiceEnvironment(self, p: Params) -> dict[str, Any]:
        view = self._environment(p.req_string("serviceEnvironment"))
        message = self.make(inp.DeleteServiceEnvironment, name=view.spec.name)
        await self._write_resource(self.rm.environments, view.spec.name, view.spec, "DELETING", message)
        return {}

    # ----- job queues --------------------------------------------------------------------------

    def _time_limits(self, p: Params) -> tuple[TimeLimitAction, ...] | None:
        items = p.objs("jobStateTimeLimitActions", max_items=5)
        if items is None:
            return None
        actions = []
        for item in items:
            item.enum("state", ("RUNNABLE",), required=True)
            action = item.enum("action", ("CANCEL", "TERMINATE"), required=True)
            if action != "TERMINATE":
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

    def _environment_order(self, p: Params, required: bool) -> str | None:
        if p.has("computeEnvironmentOrder"):
            raise ClientException("computeEnvironmentOrder is not supported: use serviceEnvironmentOrder")
        items = p.objs("serviceEnvironmentOrder", required=required)
        if items is None:
            return None
        if len(items) != 1:
            raise ClientException("A job queue must have exactly one service environment")
        items[0].req_integer("order", low=0)
        return self._environment(items[0].req_string("serviceEnvironment")).spec.name

    async def op_CreateJobQueue(self, p: Params) -> dict[str, Any]:
        name = p.req_name("jobQueueName")
        state = _state(p.enum("state", STATES), State.ENABLED)
        priority = p.req_integer("priority", low=0, high=1000)
        p.enum("jobQueueType", ("SAGEMAKER_TRAINING",))
        policy_ref = p.string("schedulingPolicyArn")
        if policy_ref is None:
            raise ClientException(
                "schedulingPolicyArn is required: gpuquota job queues use a quota share policy"
            )
        policy = self._policy(policy_ref).spec.name
        environment = self._environment_order(p, required=True)
        assert environment is not None
        spec = JobQueueSpec(
            name=name,
            state=state,
            priority=priority,
            service_environment=environment,
            scheduling_policy=policy,
            time_limit_actions=self._time_limits(p) or (),
            tags=p.tags() or {},
        )
        if name in self.rm.queues:
            raise ClientException("Object already exists")
        message = self.make(inp.CreateJobQueue, spec=spec)
        await self._write_resource(self.rm.queues, name, spec, "CREATING", message)
        return {"jobQueueName": name, "jobQueueArn": self.arns.queue(name)}

    async def op_UpdateJobQueue(self, p: Params) -> dict[str, Any]:
        view = self._queue(p.req_string("jobQueue"))
        changes: dict[str, Any] = {}
        if (state := p.enum("state", STATES)) is not None:
            changes["state"] = State(state)
        if (priority := p.integer("priority", low=0, high=1000)) is not None:
            changes["priority"] = priority
        if (policy_ref := p.string("schedulingPolicyArn")) is not None:
            changes["scheduling_policy"] = self._policy(policy_ref).spec.name
        if (environment := self._environment_order(p, required=False)) is not None:
            changes["service_environment"] = environment
        if (actions := self._time_limits(p)) is not None:
            changes["time_limit_actions"] = actions
        spec = view.spec.model_copy(update=changes)
        message = self.make(inp.UpdateJobQueue, spec=spec)
        await self._write_resource(self.rm.queues, spec.name, spec, "UPDATING", message)
        return {"jobQueueName": spec.name, "jobQueueArn": self.arns.queue(spec.name)}

    async def op_DescribeJobQueues(self, p: Params) -> dict[str, Any]:
        refs = p.strs("jobQueues", max_items=100)
        if refs:
            names = []
            for ref in refs:
                (name,) = self._ref(ref, "job-queue", "job queue")
                if name in self.rm.queues and name not in names:
                    names.append(name)
        else:
            names = sorted(self.rm.queues)
        page, token = paginate(names, p)
        out: dict[str, Any] = {"jobQueues": [self.rm.describe_queue(self.rm.queues[n]) for n in page]}
        if token:
            out["nextToken"] = token
        return out

    async def op_DeleteJobQueue(self, p: Params) -> dict[str, Any]:
        view = self._queue(p.req_string("jobQueue"))
        message = self.make(inp.DeleteJobQueue, name=view.spec.name)
        await self._write_resource(self.rm.queues, view.spec.name, view.spec, "DELETING", message)
        return {}

    async def op_GetJobQueueSnapshot(self, p: Params) -> dict[str, Any]:
        view = self._queue(p.req_string("jobQueue"))
        return self.rm.snapshot(view.spec.name, self.clock())

    # ----- quota shares ------------------------------------------------------------------------

    def _share_limits(self, p: Params, required: bool) -> tuple[CapacityLimit, ...] | None:
        items = p.objs("capacityLimits", required=required)
        if items is None:
            return None
        if not 1 <= len(items) <= 5:
            raise ClientException("A quota share must have between 1 and 5 capacity limits")
        limits = tuple(
            CapacityLimit(
                unit=item.req_unit(),
                max_capacity=item.req_integer("maxCapacity", low=1),
            )
            for item in items
        )
        units = [c.unit for c in limits]
        if len(set(units)) != len(units):
            raise ClientException("capacityLimits lists a capacityUnit more than once")
        return limits

    def _sharing(self, p: Params, required: bool) -> tuple[Strategy, int | None] | None:
        sharing = p.obj("resourceSharingConfiguration", required=required)
        if sharing is None:
            return None
        strategy = Strategy(sharing.req_enum("strategy", tuple(s.value for s in Strategy)))
        borrow = sharing.integer("borrowLimit", low=-1)
        if borrow is not None and borrow != -1 and strategy is not Strategy.LEND_AND_BORROW:
            raise ClientException(
                "borrowLimit can only be applied to quota shares with a strategy of LEND_AND_BORROW"
            )
        return strategy, borrow

    def _in_share(self, p: Params, required: bool) -> bool | None:
        config = p.obj("preemptionConfiguration", required=required)
        if config is None:
            return None
        return config.enum("inSharePreemption", STATES, required=True) == "ENABLED"

    async def op_CreateQuotaShare(self, p: Params) -> dict[str, Any]:
        name = p.req_name("quotaShareName")
        queue = self._queue(p.req_string("jobQueue"))
        limits = self._share_limits(p, required=True)
        sharing = self._sharing(p, required=True)
        in_share = self._in_share(p, required=True)
        state = _state(p.enum("state", STATES), State.ENABLED)
        tags = p.tags() or {}
        assert limits is not None and sharing is not None and in_share is not None
        queue_name = queue.spec.name
        if queue.status != "VALID":
            raise ClientException(
                f"Job queue {queue_name} is {queue.status}: quota shares need a VALID job queue"
            )
        if (queue_name, name) in self.rm.shares:
            raise ClientException(f"Quota share {name} already exists in job queue {queue_name}")
        if sum(1 for q, _ in self.rm.shares if q == queue_name) >= MAX_SHARES_PER_QUEUE:
            raise ClientException(f"Job queue {queue_name} already has {MAX_SHARES_PER_QUEUE} quota shares")
        strategy, borrow = sharing
        spec = QuotaShareSpec(
            name=name,
            job_queue=queue_name,
            capacity_limits=limits,
            strategy=strategy,
            borrow_limit=-1 if borrow is None else borrow,
            in_share_preemption=in_share,
            state=state,
            tags=tags,
        )
        message = self.make(inp.CreateQuotaShare, spec=spec)
        await self._write_resource(self.rm.shares, (queue_name, name), spec, "CREATING", message)
        return {"quotaShareName": name, "quotaShareArn": self.arns.share(queue_name, name)}

    async def op_UpdateQuotaShare(self, p: Params) -> dict[str, Any]:
        view = self._share(p.req_string("quotaShareArn"))
        changes: dict[str, Any] = {}
        if (limits := self._share_limits(p, required=False)) is not None:
            changes["capacity_limits"] = limits
        if (sharing := self._sharing(p, required=False)) is not None:
            changes["strategy"], borrow = sharing
            changes["borrow_limit"] = -1 if borrow is None else borrow
        if (in_share := self._in_share(p, required=False)) is not None:
            changes["in_share_preemption"] = in_share
        if (state := p.enum("state", STATES)) is not None:
            changes["state"] = State(state)
        spec = view.spec.model_copy(update=changes)
        if view.status == "DELETING":
            raise ClientException(f"Quota share {spec.name} is being deleted")
        key = (spec.job_queue, spec.name)
        message = self.make(inp.UpdateQuotaShare, spec=spec)
        await self._write_resource(self.rm.shares, key, spec, "UPDATING", message)
        return {"quotaShareName": spec.name, "quotaShareArn": self.arns.share(*key)}

    async def op_DescribeQuotaShare(self, p: Params) -> dict[str, Any]:
        return self.rm.describe_share(self._share(p.req_string("quotaShareArn")))

    async def op_ListQuotaShares(self, p: Params) -> dict[str, Any]:
        queue = self._queue(p.req_string("jobQueue")).spec.name
        keys = sorted(k for k in self.rm.shares if k[0] == queue)
        page, token = paginate(keys, p)
        out: dict[str, Any] = {
            "quotaShares": [self.rm.describe_share(self.rm.shares[k], with_tags=False) for k in page]
        }
        if token:
            out["nextToken"] = token
        return out

    async def op_DeleteQuotaShare(self, p: Params) -> dict[str, Any]:
        view = self._share(p.req_string("quotaShareArn"))
        spec = view.spec
        message = self.make(inp.DeleteQuotaShare, job_queue=spec.job_queue, name=spec.name)
        await self._write_resource(self.rm.shares, (spec.job_queue, spec.name), spec, "DELETING", message)
        return {}

    # ----- service jobs ------------------------------------------------------------------------

    def _demand(self, payload: str) -> tuple[str, int]:
        if len(payload.encode()) > MAX_PAYLOAD_BYTES:
            raise ClientException("serviceRequestPayload must be at most 10 KiB")
        request = parse_json(payload, "serviceRequestPayload")
        if not isinstance(request, dict):
            raise ClientException("serviceRequestPayload must be a JSON object")
        body = Params(request, "serviceRequestPayload")
        config = body.obj("ResourceConfig", required=True)
        assert config is not None
        if config.has("InstanceGroups"):
            raise ClientException("serviceRequestPayload.ResourceConfig.InstanceGroups is not supported yet")
        unit = config.req_string("InstanceType", max_len=128)
        if not unit:
            raise ClientException("serviceRequestPayload.ResourceConfig.InstanceType must not be empty")
        count = config.integer("InstanceCount", low=1)
        return unit, 1 if count is None else count

    def _retry(self, p: Params) -> tuple[int, tuple[ExitRule, ...]]:
        retry = p.obj("retryStrategy")
        if retry is None:
            return 1, ()
        attempts = retry.req_integer("attempts", low=1, high=10)
        rules = []
        for rule in retry.objs("evaluateOnExit", max_items=5) or []:
            action = (rule.req_string("action")).upper()
            if action not in ("RETRY", "EXIT"):
                raise ClientException(f"{rule.where}.action must be RETRY or EXIT")
            reason = rule.string("onStatusReason", max_len=512)
            rules.append(
                ExitRule(action="RETRY" if action == "RETRY" else "EXIT", on_status_reason=reason or "*")
            )
        return attempts, tuple(rules)

    async def op_SubmitServiceJob(self, p: Params) -> dict[str, Any]:
        job_name = p.req_name("jobName")
        queue = self._queue(p.req_string("jobQueue"))
        p.enum("serviceJobType", ("SAGEMAKER_TRAINING",), required=True)
        payload = p.req_string("serviceRequestPayload")
        unit, count = self._demand(payload)
        queue_name = queue.spec.name
        if p.has("shareIdentifier"):
            raise ClientException(
                "shareIdentifier cannot be used with a job queue that has a quota share policy"
            )
        share_name = p.string("quotaShareName")
        if share_name is None:
            raise ClientException(
                "quotaShareName must be specified for a job queue that has a quota share scheduling policy"
            )
        if queue.spec.state is not State.ENABLED:
            raise ClientException(f"Job queue {queue_name} is DISABLED")
        share = self.rm.shares.get((queue_name, share_name))
        if share is None or share.status == "DELETING":
            raise ClientException(f"Quota share {share_name} does not exist in job queue {queue_name}")
        if share.spec.state is not State.ENABLED:
            raise ClientException(f"Quota share {share_name} is DISABLED")
        priority = p.integer("schedulingPriority", low=0, high=9999) or 0
        attempts, rules = self._retry(p)
        preemption = p.obj("preemptionConfiguration")
        retries = (
            None if preemption is None else preemption.integer("preemptionRetriesBeforeTermination", low=0)
        )
        timeout = p.obj("timeoutConfig")
        duration = None if timeout is None else timeout.integer("attemptDurationSeconds", low=1)
        tags = p.tags() or {}
        token = p.string("clientToken")
        fingerprint = ""
        if token is not None:
            if not 1 <= len(token) <= 64:
                raise ClientException("clientToken must be 1 to 64 characters")
            request = {k: v for k, v in p.body.items() if k != "clientToken"}
            fingerprint = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
            if (seen := self.rm.client_tokens.get(token)) is not None:
                if seen[0] != fingerprint:
                    raise ClientException("clientToken was already used with a different request")
                if (job := self.rm.jobs.get(seen[1])) is not None:
                    return self._job_ref(job)
        spec = self._build(
            JobSpec,
            job_id=_uuid4(),
            job_name=job_name,
            job_queue=queue_name,
            quota_share=share_name,
            priority=priority,
            unit=unit,
            count=count,
            created_at=self.clock(),
            retry_attempts=attempts,
            evaluate_on_exit=rules,
            preemption_retries=retries,
            attempt_duration_seconds=duration,
            payload=payload,
            tags=tags,
            client_token=token,
            request_digest=fingerprint,
        )
        message = self.make(inp.SubmitJob, job=spec)
        job = self.rm.pending_job(spec, message.event_id)
        if token is not None:
            self.rm.client_tokens[token] = (fingerprint, spec.job_id)
        try:
            await self._send(message)
        except BaseException:
            self.rm.revert_job(spec.job_id, message.event_id)
            if token is not None:
                self.rm.client_tokens.pop(token, None)
            raise
        return self._job_ref(job)

    def _build(self, kind: type[B], **fields: Any) -> B:
        try:
            return kind(**fields)
        except ValidationError as exc:
            raise ClientException(_validation_message(exc)) from None

    def _job_ref(self, job: JobView) -> dict[str, Any]:
        return {
            "jobArn": self.arns.job(job.spec.job_id),
            "jobName": job.spec.job_name,
            "jobId": job.spec.job_id,
        }

    async def op_UpdateServiceJob(self, p: Params) -> dict[str, Any]:
        job = self._job(p.req_string("jobId"))
        priority = p.req_integer("schedulingPriority", low=0, high=9999)
        if job.terminal:
            raise ClientException(
                f"Service job {job.spec.job_id} is {job.status.value}: it cannot be updated"
            )
        await self._send(self.make(inp.UpdateJobPriority, job_id=job.spec.job_id, priority=priority))
        return self._job_ref(job)

    async def op_DescribeServiceJob(self, p: Params) -> dict[str, Any]:
        return self.rm.describe_job(self._job(p.req_string("jobId")))

    async def op_ListServiceJobs(self, p: Params) -> dict[str, Any]:
        return self.list_service_jobs(p)

    def list_service_jobs(self, p: Params, visible: Principal | None = None) -> dict[str, Any]:
        """ListServiceJobs; with ``visible``, only the jobs of the shares that principal owns."""
        queue_ref = p.string("jobQueue")
        queue = None if queue_ref is None else self._queue(queue_ref).spec.name
        status = p.enum("jobStatus", JOB_STATUSES)
        filters = p.objs("filters") or []
        if len(filters) > 1:
            raise ClientException("Only one filter can be used at a time")
        jobs = [
            j
            for j in self.rm.jobs.values()
            if (queue is None or j.spec.job_queue == queue)
            and (visible is None or visible.owns(j.spec.job_queue, j.spec.quota_share))
        ]
        if filters:
            name = filters[0].req_enum("name", FILTERS)
            values = filters[0].strs("values", required=True) or []
            if not values:
                raise ClientException("filters[0].values must have at least one value")
            jobs = [j for j in jobs if _matches(j, name, values)]
            if name in ("SHARE_IDENTIFIER", "QUOTA_SHARE_NAME") and status is not None:
                jobs = [j for j in jobs if j.status.value == status]
        else:
            wanted = status or "RUNNING"
            jobs = [j for j in jobs if j.status.value == wanted]
        jobs.sort(key=lambda j: (-j.spec.created_at, j.spec.job_id))
        page, token = paginate(jobs, p)
        out: dict[str, Any] = {"jobSummaryList": [self.rm.job_summary(j) for j in page]}
        if token:
            out["nextToken"] = token
        return out

    async def _terminate(self, ref: str, reason: str, unknown_ok: bool = False) -> None:
        """``unknown_ok``: TerminateServiceJobs, where AWS reports unknown ids as successful."""
        if unknown_ok and self._ref(ref, "service-job", "service job")[0] not in self.rm.jobs:
            return
        job = self._job(ref)
        if job.terminal:
            return
        await self._send(self.make(inp.TerminateJob, job_id=job.spec.job_id, reason=reason))

    async def op_TerminateServiceJob(self, p: Params) -> dict[str, Any]:
        ref = p.req_string("jobId")
        await self._terminate(ref, p.req_string("reason", max_len=1024))
        return {}

    async def op_TerminateServiceJobs(self, p: Params) -> dict[str, Any]:
        refs = p.strs("jobs", required=True, max_items=MAX_TERMINATE_JOBS) or []
        reason = p.req_string("reason", max_len=1024)
        successful: list[str] = []
        errors: list[dict[str, str]] = []
        for ref in refs:
            try:
                await self._terminate(ref, reason, unknown_ok=True)
            except ApiError as exc:
                errors.append({"job": ref, "code": exc.code, "message": exc.message})
            else:
                successful.append(ref)
        return {"successful": successful, "errors": errors}

    # ----- tags --------------------------------------------------------------------------------

    def _tagged(self, arn: str) -> tuple[str, Any]:
        parsed = self.arns.parse(unquote(arn))
        if parsed is None:
            raise ClientException(f"{arn} is not a taggable resource ARN")
        kind, names = parsed
        if kind == "scheduling-policy":
            return kind, self._policy(names[0])
        if kind == "service-environment":
            return kind, self._environment(names[0])
        if kind == "job-queue":
            return kind, self._queue(names[0])
        if kind == "quota-share":
            return kind, self._share(unquote(arn))
        return kind, self._job(names[0])

    async def _retag(self, arn: str, change: Callable[[dict[str, str]], dict[str, str]]) -> None:
        kind, target = self._tagged(arn)
        if isinstance(target, JobView):
            target.tags = check_tags(change(dict(target.tags)))
            return await self._send(self.make(inp.TagJob, job_id=target.spec.job_id, tags=target.tags))
        view: ResourceView[Any] = target
        spec = view.spec.model_copy(update={"tags": check_tags(change(dict(view.spec.tags)))})
        if kind == "service-environment":
            self._pool_of(spec.tags)
        if kind == "scheduling-policy":
            spec = policy_with_extensions(spec)
            await self._write_resource(
                self.rm.policies,
                spec.name,
                spec,
                "UPDATING",
                self.make(inp.UpdateSchedulingPolicy, spec=spec),
            )
        elif kind == "service-environment":
            await self._write_resource(
                self.rm.environments,
                spec.name,
                spec,
                "UPDATING",
                self.make(inp.UpdateServiceEnvironment, spec=spec),
            )
        elif kind == "job-queue":
            await self._write_resource(
                self.rm.queues, spec.name, spec, "UPDATING", self.make(inp.UpdateJobQueue, spec=spec)
            )
        else:
            await self._write_resource(
                self.rm.shares,
                (spec.job_queue, spec.name),
                spec,
                "UPDATING",
                self.make(inp.UpdateQuotaShare, spec=spec),
            )

    async def tag_resource(self, arn: str, p: Params) -> dict[str, Any]:
        new = p.tags()
        if not new:
            raise ClientException("Missing required parameter: tags")
        await self._retag(arn, lambda tags: {**tags, **new})
        return {}

    async def untag_resource(self, arn: str, keys: list[str]) -> dict[str, Any]:
        if not keys:
            raise ClientException("Missing required parameter: tagKeys")
        await self._retag(arn, lambda tags: {k: v for k, v in tags.items() if k not in keys})
        return {}

    async def list_tags(self, arn: str) -> dict[str, Any]:
        _, target = self._tagged(arn)
        if isinstance(target, JobView):
            return {"tags": dict(target.tags)}
        return {"tags": dict(target.spec.tags)}

    # ----- gpuquota extensions (not AWS): ``gpuquota shares`` and ``gpuquota explain`` ------------

    async def shares(self, queue_ref: str | None) -> dict[str, Any]:
        """Per share: strategy, limits, usage, borrowed, lent and queued jobs (of one queue or all)."""
        queue = None if not queue_ref else self._queue(queue_ref).spec.name
        return {"quotaShares": self.rm.share_table(queue)}

    async def explain(self, ref: str) -> dict[str, Any]:
        """Why a job waits or was preempted: the core's explanation plus the read model's preemptions."""
        job = self._job(ref)
        spec = job.spec
        out: dict[str, Any] = {
            "jobId": spec.job_id,
            "jobName": spec.job_name,
            "jobQueue": spec.job_queue,
            "quotaShareName": spec.quota_share,
            "status": job.status.value,
            "statusReason": job.status_reason,
            "schedulingPriority": job.priority,
            "demand": {"capacityUnit": spec.unit, "quantity": spec.count},
            "preemptedAttemptCount": job.preempted_count,
            "explanation": None,
            "lastPreemption": job.preemptions[0] if job.preemptions else None,
            "preemptions": list(job.preemptions),
            "history": [{"at": at, "status": status} for at, status in job.history],
        }
        found = None if self.explainer is None or job.terminal else self.explainer(spec.job_id)
        if found is not None:
            head = None if found.share_head is None else self.rm.jobs.get(found.share_head)
            out["explanation"] = {
                "reason": found.reason,
                "message": found.message,
                "position": found.position,
                "shareHead": found.share_head,
                "shareHeadName": None if head is None else head.spec.job_name,
                "figures": {_camel(k): v for k, v in found.figures.items()},
                "startEstimate": found.estimate,
                "until": found.until,
            }
        return out

    async def _shares_route(self, request: web.Request) -> web.Response:
        principal = await self._authenticate(request)
        if principal is not None and not principal.admin:
            raise self._denied(principal, "gpuquota:ListShares")
        return _json(await self.shares(request.query.get("queue")))

    async def _explain_route(self, request: web.Request) -> web.Response:
        principal = await self._authenticate(request)
        ref = unquote(request.match_info["job"])
        if principal is not None and not principal.admin:
            self._check_job(principal, "gpuquota:ExplainJob", ref)
        return _json(await self.explain(ref))

    # ----- authentication and authorization (``gpuquota.gateway.auth``) --------------------------

    async def _authenticate(self, request: web.Request) -> Principal | None:
        """The principal that signed ``request`` (``None`` when authentication is off)."""
        if self.auth is None:
            return None
        headers: dict[str, list[str]] = {}
        for name, value in request.headers.items():
            headers.setdefault(name.lower(), []).append(value)
        raw_path, _, raw_query = request.raw_path.partition("?")
        signed = SignedRequest(request.method, raw_path, raw_query, headers, await request.read())
        now = dt.datetime.fromtimestamp(self.clock() / 1000, dt.UTC)
        return verify(signed, self.auth, now)

    def _denied(self, principal: Principal, action: str) -> AccessDenied:
        return AccessDenied(f"User {principal.access_key} is not authorized to perform: {action}")

    def _check_job(self, principal: Principal, action: str, ref: str) -> None:
        """Deny unless ``ref`` is unknown (the operation then says so) or a job of a share of the key."""
        try:
            job = self._job(ref)
        except ClientException:
            return
        if not principal.owns(job.spec.job_queue, job.spec.quota_share):
            raise self._denied(principal, f"{action} on {self.arns.job(job.spec.job_id)}")

    def _authorize(self, principal: Principal, name: str, p: Params) -> None:
        """Raise ``AccessDenied`` unless a share-limited ``principal`` may call ``name`` with ``p``."""
        action = f"batch:{self.operation_names[name]}"
        if not principal.may(name):
            raise self._denied(principal, action)
        if name == "submitservicejob":
            queue = self._queue(p.req_string("jobQueue")).spec.name
            share = p.string("quotaShareName")
            if share is not None and not principal.owns(queue, share):
                raise self._denied(principal, f"{action} on {self.arns.share(queue, share)}")
        elif name in ("updateservicejob", "describeservicejob", "terminateservicejob"):
            self._check_job(principal, action, p.req_string("jobId"))
        elif name == "terminateservicejobs":
            for ref in p.strs("jobs", required=True, max_items=MAX_TERMINATE_JOBS) or []:
                self._check_job(principal, action, ref)

    # ----- HTTP --------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/health", _health)
        app.router.add_route("*", "/v1/tags/{arn:.+}", self._tags)
        app.router.add_get("/gpuquota/v1/shares", self._shares_route)
        app.router.add_get("/gpuquota/v1/jobs/{job:.+}/explain", self._explain_route)
        for hook in self.route_hooks:
            hook(app)
        app.router.add_route("*", "/v1/{operation}", self._operation)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    async def _operation(self, request: web.Request) -> web.Response:
        principal = await self._authenticate(request)
        name = request.match_info["operation"].lower()
        operation = self.operations.get(name)
        if operation is None or request.method != "POST":
            raise ClientException(f"Unknown operation {request.method} {request.path}")
        raw = await request.read()
        if name == "submitservicejob" and len(raw) > MAX_SUBMIT_BYTES:
            raise ClientException("SubmitServiceJob requests must be at most 30 KiB")
        params = _body(raw)
        if principal is not None and not principal.admin:
            self._authorize(principal, name, params)
            if name == "listservicejobs":
                return _json(self.list_service_jobs(params, principal))
        return _json(await operation(params))

    async def _tags(self, request: web.Request) -> web.Response:
        principal = await self._authenticate(request)
        arn = unquote(request.match_info["arn"])
        if principal is not None and not principal.admin:
            action = {"GET": "ListTagsForResource", "POST": "TagResource", "DELETE": "UntagResource"}
            raise self._denied(principal, f"batch:{action.get(request.method, request.method)}")
        if request.method == "GET":
            return _json(await self.list_tags(arn))
        if request.method == "POST":
            return _json(await self.tag_resource(arn, _body(await request.read())))
        if request.method == "DELETE":
            return _json(await self.untag_resource(arn, request.query.getall("tagKeys", [])))
        raise ClientException(f"Unknown operation {request.method} {request.path}")

    async def _unknown(self, request: web.Request) -> web.Response:
        await self._authenticate(request)
        raise ClientException(f"Unknown operation {request.method} {request.path}")


def _matches(job: JobView, name: str, values: list[str]) -> bool:
    if name == "JOB_NAME":
        job_name = job.spec.job_name.lower()
        return any(
            job_name.startswith(v[:-1].lower()) if v.endswith("*") else job_name == v.lower() for v in values
        )
    if name in ("BEFORE_CREATED_AT", "AFTER_CREATED_AT"):
        try:
            at = int(values[0])
        except ValueError:
            raise ClientException(f"The {name} filter needs a time in epoch milliseconds") from None
        return job.spec.created_at < at if name == "BEFORE_CREATED_AT" else job.spec.created_at > at
    if name == "QUOTA_SHARE_NAME":
        return job.spec.quota_share in values
    return False  # SHARE_IDENTIFIER: quota-share jobs have none


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


async def _health(_: web.Request) -> web.Response:
    return _json({"status": "ok"})


POOL_TAG = "gpuquota:pool"
BACKFILL_TAG = "gpuquota:backfill"


def policy_with_extensions(spec: SchedulingPolicySpec) -> SchedulingPolicySpec:
    """gpuquota's extensions of a scheduling policy travel as tags the AWS API already carries:
    ``gpuquota:backfill=true`` turns on backfill (semantics S3.2)."""
    value = spec.tags.get(BACKFILL_TAG, "false").lower()
    if value not in ("true", "false"):
        raise ClientException(f"Tag {BACKFILL_TAG} must be true or false, not {spec.tags[BACKFILL_TAG]!r}")
    return spec.model_copy(update={"backfill": value == "true"})
