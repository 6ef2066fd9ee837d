"""The AWS Batch REST-JSON gateway (interface I2): routing, authentication and the operation table.

Theory of operation
-------------------
Every operation is ``POST /v1/<operation in lower case>`` with a JSON body (tags: ``/v1/tags/{arn}``
with POST, GET and DELETE), exactly as botocore's ``batch`` model sends them. The operations live one
module per resource family (``policies``, ``environments``, ``queues``, ``shares``, ``jobs``, ``tags``);
the table ``OPERATIONS`` names, per operation, its handler, its access check and its body limit. The
body is first checked against the operation's input shape in botocore's ``batch`` model (required
members, types, lengths, enums: ``gpuquota.gateway.shapes``); the handler checks gpuquota's own rules
on top, reads from the ``ReadModel`` and turns writes into scheduler inputs sent through the
``CommandPort`` (``gpuquota.gateway.context``). AWS updates are
partial; the handler merges them with the current spec from the read model, so the scheduler always
receives a whole spec; the AWS response shapes come from ``gpuquota.gateway.render``.

Before sending a write the gateway records the resource's pending status in the read model
(``CREATING``, ``UPDATING``, ``DELETING``, a job ``SUBMITTED``), so reading right after writing never
answers "does not exist"; a rejection by the core restores the previous view and becomes a
``ClientException`` carrying the core's reason.

Errors: ``ClientException`` (HTTP 400) and ``ServerException`` (HTTP 500), with the header
``x-amzn-ErrorType`` and the body ``{"message": ...}``, which botocore turns into ``ClientError``. An
operation that adds work (``admitted``: ``SubmitServiceJob``) first asks the admission control
(``gpuquota.gateway.admission``), before authentication and before its body is read: while the
scheduler is behind it is a 429 ``TooManyRequestsException`` that cost no parsing.

``POST /`` is AWS's query protocol for the two identity calls the SageMaker SDK makes, STS
``GetCallerIdentity`` and IAM ``GetRole`` (``gpuquota.gateway.identity``).

Before any of this, the ``BrowserGuard`` (``gpuquota.gateway.browser_guard``) refuses what a web page
could send: a foreign ``Host`` (421), a foreign ``Origin`` (403), a POST that is not JSON (415).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from gpuquota.gateway import environments, identity, jobs, policies, queues, shares, tags
from gpuquota.gateway.access import authenticate, check_job, denied
from gpuquota.gateway.admission import Admission
from gpuquota.gateway.auth import Keyring, Principal
from gpuquota.gateway.browser_guard import QUERY_PATH, BrowserGuard
from gpuquota.gateway.context import Context, Operation
from gpuquota.gateway.edge import body_params as _body
from gpuquota.gateway.edge import errors as _errors
from gpuquota.gateway.edge import json_response as _json
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.extensions import Explainer, explain, share_table_of
from gpuquota.gateway.params import Params
from gpuquota.gateway.plans import PlanRoutes
from gpuquota.gateway.ports import CommandPort
from gpuquota.gateway.shapes import batch_shapes
from gpuquota.read.model import ReadModel
from gpuquota.support.clock import Clock, wall_clock_ms

OPERATIONS: tuple[Operation, ...] = (
    Operation("CreateSchedulingPolicy", policies.create),
    Operation("UpdateSchedulingPolicy", policies.update),
    Operation("DescribeSchedulingPolicies", policies.describe),
    Operation("ListSchedulingPolicies", policies.list_all),
    Operation("DeleteSchedulingPolicy", policies.delete),
    Operation("CreateServiceEnvironment", environments.create),
    Operation("UpdateServiceEnvironment", environments.update),
    Operation("DescribeServiceEnvironments", environments.describe),
    Operation("DeleteServiceEnvironment", environments.delete),
    Operation("CreateJobQueue", queues.create),
    Operation("UpdateJobQueue", queues.update),
    Operation("DescribeJobQueues", queues.describe),
    Operation("DeleteJobQueue", queues.delete),
    Operation("GetJobQueueSnapshot", queues.get_snapshot),
    Operation("CreateQuotaShare", shares.create),
    Operation("UpdateQuotaShare", shares.update),
    Operation("DescribeQuotaShare", shares.describe),
    Operation("ListQuotaShares", shares.list_all),
    Operation("DeleteQuotaShare", shares.delete),
    Operation(
        "SubmitServiceJob",
        jobs.submit,
        guard=jobs.guard_submit,
        max_bytes=jobs.MAX_SUBMIT_BYTES,
        admitted=True,
    ),
    Operation("UpdateServiceJob", jobs.update, guard=jobs.guard_job),
    Operation("DescribeServiceJob", jobs.describe, guard=jobs.guard_job),
    Operation("ListServiceJobs", jobs.list_all, scoped=jobs.list_visible),
    Operation("TerminateServiceJob", jobs.terminate, guard=jobs.guard_job),
    Operation("TerminateServiceJobs", jobs.terminate_many, guard=jobs.guard_jobs),
)
"""The AWS Batch operations the gateway serves (interface I2)."""
MAX_BODY_BYTES = 1024 * 1024
TAG_ACTIONS = {"GET": "ListTagsForResource", "POST": "TagResource", "DELETE": "UntagResource"}
CHECKED = (*(op.name for op in OPERATIONS), "TagResource")
"""The operations whose bodies are checked against botocore's model (``gateway.shapes``)."""

BoundOperation = Callable[[Params], Awaitable[dict[str, Any]]]


class Gateway(Context):
    """The operations of I2 over a read model and a command port, as an aiohttp application."""

    def __init__(
        self,
        read_model: ReadModel,
        port: CommandPort,
        *,
        clock: Clock = wall_clock_ms,
        pool: str = "default",
        explainer: Explainer | None = None,
        auth: Keyring | None = None,
        guard: BrowserGuard | None = None,
        admission: Admission | None = None,
    ) -> None:
        super().__init__(read_model, port, clock, pool)
        self.admission = admission
        """The port's admission control, asked first by the operations that add work (``None``: the
        port alone asks, after the request is parsed)."""
        self.explainer = explainer
        self.auth = auth
        self.guard = guard or BrowserGuard()  # the console reads its token
        self.route_hooks: list[Callable[[web.Application], None]] = []  # /metrics, /health/*, /console/
        self.s3_endpoint: str | None = None
        """The S3 endpoint of this stack's node agents, for ``gpuquota env`` (``None``: AWS's)."""
        self.s3_client_key: tuple[str, str] | None = None
        """The key pair of the S3 server this stack runs itself (``gpuquota up --s3 local``): handed
        to ``gpuquota env`` when authentication is off (any key may then call anything here)."""
        self.table = {op.name.lower(): op for op in OPERATIONS}
        self.operation_names = {lower: op.name for lower, op in self.table.items()}
        self.operations: dict[str, BoundOperation] = {
            lower: functools.partial(op.handler, self) for lower, op in self.table.items()
        }
        self.shapes = batch_shapes(CHECKED)

    async def call(self, name: str, params: Params) -> dict[str, Any]:
        """Run the operation ``name`` (``UpdateServiceJob``) as an admin would (the console)."""
        self.shapes.check(self.table[name.lower()].name, params.body)
        return await self.operations[name.lower()](params)

    async def shares(self, queue_ref: str | None) -> dict[str, Any]:
        return share_table_of(self, queue_ref)

    async def explain(self, ref: str) -> dict[str, Any]:
        return explain(self, self.explainer, ref)

    # ----- HTTP --------------------------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [self.guard.middleware, _errors]  # the guard first: before the body is read
        app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/health", _health)
        app.router.add_route("*", "/v1/tags/{arn:.+}", self._tags)
        app.router.add_get("/gpuquota/v1/shares", self._shares_route)
        app.router.add_get("/gpuquota/v1/jobs/{job:.+}/explain", self._explain_route)
        app.router.add_get("/gpuquota/v1/env", self._env_route)
        PlanRoutes(self).add_routes(app)
        for hook in self.route_hooks:
            hook(app)
        app.router.add_route("*", "/v1/{operation}", self._operation)
        app.router.add_post(QUERY_PATH, self._query)  # STS and IAM for the SageMaker SDK
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    async def limited_principal(self, request: web.Request) -> Principal | None:
        """The share-limited principal of ``request``; ``None`` for an admin or without authentication."""
        principal = await authenticate(request, self.auth, self.clock)
        return None if principal is None or principal.admin else principal

    async def _operation(self, request: web.Request) -> web.Response:
        name = request.match_info["operation"].lower()
        row = self.table.get(name)
        if row is not None and row.admitted and self.admission is not None:
            # before authentication and the body: refusing an overload must cost next to nothing
            self.admission.check()
        principal = await self.limited_principal(request)
        operation = self.operations.get(name)
        if operation is None or request.method != "POST":
            raise ClientException(f"Unknown operation {request.method} {request.path}")
        assert row is not None
        raw = await request.read()
        if row.max_bytes is not None and len(raw) > row.max_bytes:
            raise ClientException(f"{row.name} requests must be at most {row.max_bytes // 1024} KiB")
        params = _body(raw)
        self.shapes.check(row.name, params.body)
        if principal is not None:
            action = f"batch:{row.name}"
            if not principal.may(name):
                raise denied(principal, action)
            if row.guard is not None:
                row.guard(self, principal, action, params)
            if row.scoped is not None:
                return _json(row.scoped(self, params, principal))
        return _json(await operation(params))

    async def _tags(self, request: web.Request) -> web.Response:
        principal = await self.limited_principal(request)
        arn = unquote(request.match_info["arn"])
        if principal is not None:
            raise denied(principal, f"batch:{TAG_ACTIONS.get(request.method, request.method)}")
        if request.method == "GET":
            return _json(await tags.list_tags(self, arn))
        if request.method == "POST":
            params = _body(await request.read())
            self.shapes.check("TagResource", params.body)
            return _json(await tags.tag_resource(self, arn, params))
        if request.method == "DELETE":
            return _json(await tags.untag_resource(self, arn, request.query.getall("tagKeys", [])))
        raise ClientException(f"Unknown operation {request.method} {request.path}")

    async def _shares_route(self, request: web.Request) -> web.Response:
        principal = await self.limited_principal(request)
        if principal is not None:
            raise denied(principal, "gpuquota:ListShares")
        return _json(await self.shares(request.query.get("queue")))

    async def _explain_route(self, request: web.Request) -> web.Response:
        principal = await self.limited_principal(request)
        ref = unquote(request.match_info["job"])
        if principal is not None:
            check_job(self, principal, "gpuquota:ExplainJob", ref)
        return _json(await self.explain(ref))

    async def _env_route(self, request: web.Request) -> web.Response:
        await authenticate(request, self.auth, self.clock)  # any key: it names endpoints, no secret
        arns = self.arns
        key = self.s3_client_key if self.auth is None else None  # a secret only where nothing is
        env = identity.client_environment(
            arns.account, arns.region, self.auth is not None, self.s3_endpoint, key
        )
        return _json(env)

    async def _query(self, request: web.Request) -> web.Response:
        return await identity.answer(request, self.auth, self.clock, self.arns.account, self.arns.partition)

    async def _unknown(self, request: web.Request) -> web.Response:
        await authenticate(request, self.auth, self.clock)
        raise ClientException(f"Unknown operation {request.method} {request.path}")


async def _health(_: web.Request) -> web.Response:
    return _json({"status": "ok"})
