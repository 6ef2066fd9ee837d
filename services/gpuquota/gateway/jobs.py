"""Service jobs: Submit, Update, Describe, List, Terminate and TerminateServiceJobs.

A job's demand comes from its SageMaker payload (``ResourceConfig``); a ``clientToken`` makes a submission
idempotent (the same request answers the same job; a different one with the token is refused).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypedDict

from gpuquota.gateway.access import check_job, denied
from gpuquota.gateway.auth import Principal
from gpuquota.gateway.context import Context
from gpuquota.gateway.edge import parse_json, token_job_id
from gpuquota.gateway.errors import ApiError, ClientException
from gpuquota.gateway.params import Params, paginate, with_token
from gpuquota.gateway.render import describe_job, job_summary
from gpuquota.read.jobs import JobView
from gpuquota.support.ids import uuid4
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import ExitRule, JobSpec

MAX_PAYLOAD_BYTES = 10 * 1024
MAX_SUBMIT_BYTES = 30 * 1024
MAX_TERMINATE_JOBS = 50
FILTERS = ("JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT", "SHARE_IDENTIFIER", "QUOTA_SHARE_NAME")


class Demand(TypedDict):
    """A submission's ``JobSpec`` fields that say what it runs on: ``count`` instances of ``unit``."""

    unit: str
    count: int


def _demand(payload: str) -> Demand:
    """The demand of a SageMaker ``serviceRequestPayload`` (its ``ResourceConfig``)."""
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
    return Demand(unit=unit, count=1 if count is None else count)


def _retry(p: Params) -> tuple[int, tuple[ExitRule, ...]]:
    retry = p.obj("retryStrategy")
    if retry is None:
        return 1, ()
    attempts = retry.req_integer("attempts", low=1, high=10)
    rules = []
    for rule in retry.objs("evaluateOnExit", max_items=5) or []:
        action = rule.req_string("action").upper()  # RETRY or EXIT, in any case (gateway.shapes)
        reason = rule.string("onStatusReason", max_len=512)
        rules.append(
            ExitRule(action="RETRY" if action == "RETRY" else "EXIT", on_status_reason=reason or "*")
        )
    return attempts, tuple(rules)


class AttemptPolicy(TypedDict):
    """A submission's ``JobSpec`` fields that say how often its attempts may run and for how long."""

    retry_attempts: int
    evaluate_on_exit: tuple[ExitRule, ...]
    preemption_retries: int | None
    attempt_duration_seconds: int | None


def _attempt_policy(p: Params) -> AttemptPolicy:
    """``retryStrategy``, ``preemptionConfiguration`` and ``timeoutConfig`` of a submission."""
    attempts, rules = _retry(p)
    preemption = p.obj("preemptionConfiguration")
    retries = None if preemption is None else preemption.integer("preemptionRetriesBeforeTermination", low=0)
    timeout = p.obj("timeoutConfig")
    duration = None if timeout is None else timeout.integer("attemptDurationSeconds", low=1)
    return AttemptPolicy(
        retry_attempts=attempts,
        evaluate_on_exit=rules,
        preemption_retries=retries,
        attempt_duration_seconds=duration,
    )


async def submit(gw: Context, p: Params) -> dict[str, Any]:
    job_name = p.req_name("jobName")
    queue = gw.queue(p.req_string("jobQueue"))
    payload = p.req_string("serviceRequestPayload")
    demand = _demand(payload)
    queue_name = queue.spec.name
    if p.has("shareIdentifier"):
        raise ClientException("shareIdentifier cannot be used with a job queue that has a quota share policy")
    share_name = p.string("quotaShareName")
    if share_name is None:
        raise ClientException(
            "quotaShareName must be specified for a job queue that has a quota share scheduling policy"
        )
    priority = p.ranged("schedulingPriority", JobSpec, "priority") or 0
    attempt_policy = _attempt_policy(p)
    tags = p.tags() or {}
    token = p.string("clientToken")
    fingerprint = ""
    if token is not None:
        request = {k: v for k, v in p.body.items() if k != "clientToken"}
        fingerprint = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        if (seen := gw.rm.client_tokens.get(token)) is not None:
            if seen[0] != fingerprint:
                raise ClientException("clientToken was already used with a different request")
            if (job := gw.rm.jobs.get(seen[1])) is not None:
                return job_ref(gw, job)
    spec = gw.build(
        JobSpec,
        job_id=uuid4() if token is None else token_job_id(gw.pool, token),
        job_name=job_name,
        job_queue=queue_name,
        quota_share=share_name,
        priority=priority,
        created_at=gw.clock(),
        payload=payload,
        tags=tags,
        client_token=token,
        request_digest=fingerprint,
        **demand,
        **attempt_policy,
    )
    message = gw.make(inp.SubmitJob, job=spec)
    job = gw.rm.pending_job(spec, message.event_id)
    if token is not None:
        gw.rm.client_tokens[token] = (fingerprint, spec.job_id)
    try:
        await gw.send(message)
    except BaseException:
        gw.rm.revert_job(spec.job_id, message.event_id)
        if token is not None:
            gw.rm.client_tokens.pop(token, None)
        raise
    return job_ref(gw, job)


def job_ref(gw: Context, job: JobView) -> dict[str, Any]:
    return {
        "jobArn": gw.arns.job(job.job_id),
        "jobName": job.job_name,
        "jobId": job.job_id,
    }


async def update(gw: Context, p: Params) -> dict[str, Any]:
    job = gw.job(p.req_string("jobId"))
    priority = p.ranged("schedulingPriority", JobSpec, "priority", required=True)
    assert priority is not None
    if job.terminal:
        raise ClientException(f"Service job {job.job_id} is {job.status.value}: it cannot be updated")
    await gw.send(gw.make(inp.UpdateJobPriority, job_id=job.job_id, priority=priority))
    return job_ref(gw, job)


async def describe(gw: Context, p: Params) -> dict[str, Any]:
    return describe_job(gw.arns, gw.job(p.req_string("jobId")))


async def list_all(gw: Context, p: Params) -> dict[str, Any]:
    return list_visible(gw, p)


def list_visible(gw: Context, p: Params, visible: Principal | None = None) -> dict[str, Any]:
    """ListServiceJobs; with ``visible``, only the jobs of the shares that principal owns."""
    queue_ref = p.string("jobQueue")
    queue = None if queue_ref is None else gw.queue(queue_ref).spec.name
    status = p.string("jobStatus")
    filters = p.objs("filters") or []
    if len(filters) > 1:
        raise ClientException("Only one filter can be used at a time")
    jobs = [
        j
        for j in gw.rm.jobs.values()
        if (queue is None or j.job_queue == queue)
        and (visible is None or visible.owns(j.job_queue, j.quota_share))
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
    jobs.sort(key=lambda j: (-j.created_at, j.job_id))
    page, token = paginate(jobs, p)
    return with_token({"jobSummaryList": [job_summary(gw.arns, j) for j in page]}, token)


async def _terminate(gw: Context, ref: str, reason: str, unknown_ok: bool = False) -> None:
    """``unknown_ok``: TerminateServiceJobs, where AWS reports unknown ids as successful."""
    if unknown_ok and gw.ref(ref, "service-job", "service job")[0] not in gw.rm.jobs:
        return
    job = gw.job(ref)
    if job.terminal:
        return
    await gw.send(gw.make(inp.TerminateJob, job_id=job.job_id, reason=reason))


async def terminate(gw: Context, p: Params) -> dict[str, Any]:
    ref = p.req_string("jobId")
    await _terminate(gw, ref, p.req_string("reason", max_len=1024))
    return {}


async def terminate_many(gw: Context, p: Params) -> dict[str, Any]:
    refs = p.strs("jobs", required=True, max_items=MAX_TERMINATE_JOBS) or []
    reason = p.req_string("reason", max_len=1024)
    successful: list[str] = []
    errors: list[dict[str, str]] = []
    for ref in refs:
        try:
            await _terminate(gw, ref, reason, unknown_ok=True)
        except ApiError as exc:
            errors.append({"job": ref, "code": exc.code, "message": exc.message})
        else:
            successful.append(ref)
    return {"successful": successful, "errors": errors}


def _matches(job: JobView, name: str, values: list[str]) -> bool:
    if name == "JOB_NAME":
        job_name = job.job_name.lower()
        return any(
            job_name.startswith(v[:-1].lower()) if v.endswith("*") else job_name == v.lower() for v in values
        )
    if name in ("BEFORE_CREATED_AT", "AFTER_CREATED_AT"):
        try:
            at = int(values[0])
        except ValueError:
            raise ClientException(f"The {name} filter needs a time in epoch milliseconds") from None
        return job.created_at < at if name == "BEFORE_CREATED_AT" else job.created_at > at
    if name == "QUOTA_SHARE_NAME":
        return job.quota_share in values
    return False  # SHARE_IDENTIFIER: quota-share jobs have none


def guard_submit(gw: Context, principal: Principal, action: str, p: Params) -> None:
    queue = gw.queue(p.req_string("jobQueue")).spec.name
    share = p.string("quotaShareName")
    if share is not None and not principal.owns(queue, share):
        raise denied(principal, f"{action} on {gw.arns.share(queue, share)}")


def guard_job(gw: Context, principal: Principal, action: str, p: Params) -> None:
    check_job(gw, principal, action, p.req_string("jobId"))


def guard_jobs(gw: Context, principal: Principal, action: str, p: Params) -> None:
    for ref in p.strs("jobs", required=True, max_items=MAX_TERMINATE_JOBS) or []:
        check_job(gw, principal, action, ref)
