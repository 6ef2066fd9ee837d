"""The AWS response shapes of the gateway, rendered from the read model's views.

``describe_*`` and ``job_summary`` follow botocore's ``batch`` model (times in epoch milliseconds);
``snapshot`` answers ``GetJobQueueSnapshot``. Nothing here changes the read model. (gpuquota's own
share rows, ``gpuquota shares``, come from ``gpuquota.read.shares``.)
"""

from __future__ import annotations

from typing import Any

from pydantic.alias_generators import to_camel as camel

from gpuquota.read.jobs import AttemptView, JobView
from gpuquota.read.model import ReadModel, ResourceView, RunnableKey
from gpuquota.read.shares import share_usage
from gpuquota.support.arns import ArnFactory
from gpuquota.wire.base import (
    JobQueueSpec,
    JobStatus,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    Strategy,
)

__all__ = ["camel"]


def _training_job(arns: ArnFactory, job: JobView, attempt: AttemptView) -> dict[str, Any]:
    return {"name": "TrainingJobArn", "value": arns.training_job(job.job_name, attempt.attempt_id)}


def attempt_dict(arns: ArnFactory, job: JobView, attempt: AttemptView) -> dict[str, Any]:
    out: dict[str, Any] = {"serviceResourceId": _training_job(arns, job, attempt)}
    out["startedAt"] = attempt.started_at if attempt.started_at is not None else attempt.scheduled_at
    if attempt.stopped_at is not None:
        out["stoppedAt"] = attempt.stopped_at
    if attempt.status_reason:
        out["statusReason"] = attempt.status_reason
    if attempt.outputs:
        out["gpuquotaOutputs"] = list(
            attempt.outputs
        )  # gpuquota's key: where /opt/ml/model and output are (I6)
    if attempt.checkpoint_at is not None:
        out["gpuquotaCheckpointAt"] = attempt.checkpoint_at  # gpuquota's key: its last checkpoint (S12)
    if attempt.lost_work is not None:
        out["gpuquotaLostWork"] = attempt.lost_work  # gpuquota's key: what its preemption threw away (S12)
    return out


def job_brief(job: JobView) -> dict[str, Any]:
    """Who a job is and where it stands (``gpuquota explain`` and the console's job rows)."""
    return {
        "jobId": job.job_id,
        "jobName": job.job_name,
        "jobQueue": job.job_queue,
        "quotaShareName": job.quota_share,
        "status": job.status.value,
        "statusReason": job.status_reason,
        "schedulingPriority": job.priority,
    }


def describe_policy(arns: ArnFactory, view: ResourceView[SchedulingPolicySpec]) -> dict[str, Any]:
    spec = view.spec
    return {
        "name": spec.name,
        "arn": arns.policy(spec.name),
        "quotaSharePolicy": {"idleResourceAssignmentStrategy": spec.idle_resource_assignment_strategy},
        "tags": dict(spec.tags),
    }


def describe_environment(arns: ArnFactory, view: ResourceView[ServiceEnvironmentSpec]) -> dict[str, Any]:
    spec = view.spec
    return {
        "serviceEnvironmentName": spec.name,
        "serviceEnvironmentArn": arns.environment(spec.name),
        "serviceEnvironmentType": "SAGEMAKER_TRAINING",
        "state": spec.state.value,
        "status": view.status,
        "capacityLimits": [
            {"maxCapacity": c.max_capacity, "capacityUnit": c.unit} for c in spec.capacity_limits
        ],
        "tags": dict(spec.tags),
    }


def describe_queue(arns: ArnFactory, view: ResourceView[JobQueueSpec]) -> dict[str, Any]:
    spec = view.spec
    out: dict[str, Any] = {
        "jobQueueName": spec.name,
        "jobQueueArn": arns.queue(spec.name),
        "state": spec.state.value,
        "schedulingPolicyArn": arns.policy(spec.scheduling_policy),
        "status": view.status,
        "priority": spec.priority,
        "computeEnvironmentOrder": [],
        "serviceEnvironmentOrder": [
            {"order": 1, "serviceEnvironment": arns.environment(spec.service_environment)}
        ],
        "jobQueueType": "SAGEMAKER_TRAINING",
        "tags": dict(spec.tags),
    }
    # AWS describes a healthy queue as such; gpuquota's own reasons (a rejected change) win.
    healthy = "JobQueue Healthy" if view.status == "VALID" else None
    if view.status_reason or healthy:
        out["statusReason"] = view.status_reason or healthy
    if spec.time_limit_actions:
        out["jobStateTimeLimitActions"] = [
            {
                "reason": a.reason,
                "state": a.state,
                "maxTimeSeconds": a.max_time_seconds,
                "action": a.action,
            }
            for a in spec.time_limit_actions
        ]
    return out


def describe_share(
    arns: ArnFactory, view: ResourceView[QuotaShareSpec], with_tags: bool = True
) -> dict[str, Any]:
    spec = view.spec
    sharing: dict[str, Any] = {"strategy": spec.strategy.value}
    if spec.strategy is Strategy.LEND_AND_BORROW:
        sharing["borrowLimit"] = spec.borrow_limit
    out: dict[str, Any] = {
        "quotaShareName": spec.name,
        "quotaShareArn": arns.share(spec.job_queue, spec.name),
        "jobQueueArn": arns.queue(spec.job_queue),
        "capacityLimits": [
            {"maxCapacity": c.max_capacity, "capacityUnit": c.unit} for c in spec.capacity_limits
        ],
        "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {
            "inSharePreemption": "ENABLED" if spec.in_share_preemption else "DISABLED"
        },
        "state": spec.state.value,
        "status": view.status,
    }
    if with_tags:
        out["tags"] = dict(spec.tags)
    return out


def _latest_attempt(arns: ArnFactory, job: JobView) -> dict[str, Any] | None:
    if not job.attempts:
        return None
    return {"serviceResourceId": _training_job(arns, job, job.attempts[-1])}


def _capacity_usage(job: JobView) -> list[dict[str, Any]]:
    return [{"capacityUnit": job.unit, "quantity": float(job.count)}]


def job_summary(arns: ArnFactory, job: JobView) -> dict[str, Any]:
    out: dict[str, Any] = {
        "jobId": job.job_id,
        "jobArn": arns.job(job.job_id),
        "jobName": job.job_name,
        "serviceJobType": "SAGEMAKER_TRAINING",
        "status": job.status.value,
        "createdAt": job.created_at,
        "quotaShareName": job.quota_share,
        "capacityUsage": _capacity_usage(job),
        "isTerminated": job.is_terminated,
    }
    blocked = job.blocked_reason if job.status is JobStatus.RUNNABLE else None
    if blocked or job.status_reason:
        out["statusReason"] = blocked or job.status_reason
    for key, value in (
        ("scheduledAt", job.scheduled_at),
        ("startedAt", job.started_at),
        ("stoppedAt", job.stopped_at),
    ):
        if value is not None:
            out[key] = value
    if (latest := _latest_attempt(arns, job)) is not None:
        out["latestAttempt"] = latest
    return out


def describe_job(arns: ArnFactory, job: JobView) -> dict[str, Any]:
    out = job_summary(arns, job)
    out["jobQueue"] = arns.queue(job.job_queue)
    out["serviceRequestPayload"] = job.payload
    out["schedulingPriority"] = job.priority
    retry: dict[str, Any] = {"attempts": job.retry_attempts}
    if job.evaluate_on_exit:
        retry["evaluateOnExit"] = [
            {"action": r.action, "onStatusReason": r.on_status_reason} for r in job.evaluate_on_exit
        ]
    out["retryStrategy"] = retry
    if job.preemption_retries is not None:
        out["preemptionConfiguration"] = {"preemptionRetriesBeforeTermination": job.preemption_retries}
    if job.preempted_count:
        out["preemptionSummary"] = {
            "preemptedAttemptCount": job.preempted_count,
            "recentPreemptedAttempts": [attempt_dict(arns, job, a) for a in job.recent_preempted],
        }
    out["attempts"] = [attempt_dict(arns, job, a) for a in job.attempts]
    if job.attempt_duration_seconds is not None:
        out["timeoutConfig"] = {"attemptDurationSeconds": job.attempt_duration_seconds}
    out["tags"] = dict(job.tags)
    return out


def snapshot(rm: ReadModel, queue: str, now: int) -> dict[str, Any]:
    """``GetJobQueueSnapshot`` for ``queue`` (which must exist)."""
    share_names = sorted(name for (q, name) in rm.shares if q == queue)
    fronts: dict[str, list[dict[str, Any]]] = {}
    candidates: list[tuple[RunnableKey, str]] = []
    for name in share_names:
        keys = rm.runnable.get((queue, name))
        if keys:
            head = rm.jobs[keys[0][2]]
            fronts[name] = [
                {
                    "jobArn": rm.arns.job(head.job_id),
                    "earliestTimeAtPosition": rm.time_at_position(head),
                }
            ]
            candidates.extend((key, name) for key in keys[:100])
    candidates.sort()
    front = [
        {
            "jobArn": rm.arns.job(key[2]),
            "earliestTimeAtPosition": rm.time_at_position(rm.jobs[key[2]]),
        }
        for key, _ in candidates[:100]
    ]
    total: dict[str, int] = {}
    per_share: list[dict[str, Any]] = []
    for name in share_names:
        usage = share_usage(rm, queue, name)
        for unit, count in usage.items():
            total[unit] = total.get(unit, 0) + count
        per_share.append(
            {
                "quotaShareName": name,
                "capacityUsage": [{"capacityUnit": u, "quantity": float(n)} for u, n in usage.items()],
            }
        )
    per_share.sort(key=lambda row: (-sum(c["quantity"] for c in row["capacityUsage"]), row["quotaShareName"]))
    return {
        "frontOfQueue": {"jobs": front, "lastUpdatedAt": now},
        "frontOfQuotaShares": {"quotaShares": fronts, "lastUpdatedAt": now},
        "queueUtilization": {
            "totalCapacityUsage": [
                {"capacityUnit": u, "quantity": float(n)} for u, n in sorted(total.items())
            ],
            "quotaShareUtilization": {"topCapacityUtilization": per_share},
            "lastUpdatedAt": now,
        },
    }
