"""The pipeline benchmark's workload: the pool's setup, its submissions and the node player's reports.

``submission`` and ``setup_inputs`` build the wire models (``benchmarks.pipeline --recovery``,
``benchmarks.pipeline_cpu`` and the fault tests decide them in-process). The throughput run writes
the same records as bytes from templates (``submission_json``, ``report_json``): a pydantic model and
``encode`` per record cost the load generator about 40 us per job, CPU that the machine under test
loses. Each template writes exactly the bytes ``encode`` writes for the model
(``tests/unit/test_benchmark_pipeline_load.py`` compares them): a change to the wire models
shows there first.
"""

from __future__ import annotations

import time
from json.encoder import encode_basestring
from typing import Any

from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    CapacityLimit,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    Strategy,
)
from gpuquota.wire.inputs import SchedulerInput

UNIT = "ml.g5.xlarge"
NODES = 8
SLOTS_PER_NODE = 32
SHARES = 4


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def setup_inputs(
    run: str, nodes: int = NODES, slots: int = SLOTS_PER_NODE, *, register_nodes: bool = True
) -> list[SchedulerInput]:
    """Policy, one service environment over ``nodes`` x ``slots`` instances, one queue, LEND shares,
    and the nodes (unless ``register_nodes`` is false: then every job submitted stays queued)."""
    capacity = nodes * slots
    made: list[SchedulerInput] = []

    def add(kind: type[Any], **fields: Any) -> None:
        made.append(kind(event_id=f"{run}/setup/{len(made)}", occurred_at=now_ms(), **fields))

    add(inp.CreateSchedulingPolicy, spec=SchedulingPolicySpec(name="policy"))
    limits = (CapacityLimit(unit=UNIT, max_capacity=capacity),)
    add(inp.CreateServiceEnvironment, spec=ServiceEnvironmentSpec(name="se", capacity_limits=limits))
    spec = JobQueueSpec(name="jq", service_environment="se", scheduling_policy="policy")
    add(inp.CreateJobQueue, spec=spec)
    for index in range(SHARES):
        share = QuotaShareSpec(
            name=f"s{index}",
            job_queue="jq",
            capacity_limits=(CapacityLimit(unit=UNIT, max_capacity=capacity // SHARES),),
            strategy=Strategy.LEND_AND_BORROW,
        )
        add(inp.CreateQuotaShare, spec=share)
    for index in range(nodes if register_nodes else 0):
        offers = tuple(SlotOffer(unit=UNIT) for _ in range(slots))
        add(inp.RegisterNode, node_id=f"node-{index}", slots=offers)
    return made


def job_id(run: str, index: int) -> str:
    return f"{run}-job-{index}"


def submission(run: str, index: int, at: int | None = None) -> inp.SubmitJob:
    """The ``index``-th job of run ``run``, submitted at ``at`` (epoch ms; default: now)."""
    at = now_ms() if at is None else at
    spec = JobSpec(
        job_id=job_id(run, index),
        job_name=f"job-{index}",
        job_queue="jq",
        quota_share=f"s{index % SHARES}",
        unit=UNIT,
        created_at=at,
    )
    return inp.SubmitJob(event_id=f"{run}/submit/{index}", occurred_at=at, job=spec)


def submission_json(run: str, index: int, at: int) -> bytes:
    """``encode(submission(run, index, at))`` without the model; ``run`` needs no JSON escaping."""
    return (
        f'{{"event_id":"{run}/submit/{index}","occurred_at":{at},"schema_version":1,"type":"SubmitJob",'
        f'"job":{{"job_id":"{run}-job-{index}","job_name":"job-{index}","job_queue":"jq",'
        f'"quota_share":"s{index % SHARES}","priority":0,"unit":"{UNIT}","count":1,"created_at":{at},'
        '"retry_attempts":1,"evaluate_on_exit":[],"preemption_retries":null,'
        '"attempt_duration_seconds":null,"payload":"","tags":{},"client_token":null,"request_digest":""}}'
    ).encode()


def report(attempt_id: str, node_id: str, job: str, at: int) -> inp.AttemptReport:
    """The node player's answer to a ``RunAttempt``: the attempt SUCCEEDED."""
    return inp.AttemptReport(
        event_id=f"{attempt_id}/done",  # not chained: ids must stay short
        occurred_at=at,
        node_id=node_id,
        job_id=job,
        attempt_id=attempt_id,
        status="SUCCEEDED",
        exit_code=0,
    )


def report_json(attempt_id: str, node_id: str, job: str, at: int) -> bytes:
    """``encode(report(attempt_id, node_id, job, at))`` without the model (ids JSON-escaped)."""
    attempt = encode_basestring(attempt_id)
    return (
        f'{{"event_id":{encode_basestring(attempt_id + "/done")},"occurred_at":{at},"schema_version":1,'
        f'"type":"AttemptReport","node_id":{encode_basestring(node_id)},"job_id":{encode_basestring(job)},'
        f'"attempt_id":{attempt},"status":"SUCCEEDED","exit_code":0,"status_reason":null,"outputs":[],"checkpoint_at":null}}'
    ).encode()
