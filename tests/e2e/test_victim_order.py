"""S12 through unmodified boto3 against ``gpuquota up`` with the process runtime: real checkpoint files.

The worked example's shares. QS1 runs ``old`` (dispatched first, in its quota) and ``new`` (dispatched
second, on QS2's lent instance). Only ``old`` writes a checkpoint file, once the test asks; the node
agent reports it on a heartbeat and DescribeServiceJob shows it (``gpuquotaCheckpointAt``). Then QS2's
``reclaimer`` reclaims one instance: AWS's order (the default) takes ``new``, the most recently
dispatched, which loses everything since its start; with ``gpuquota:victimOrder=leastLostWork`` on QS2
the scheduler takes ``old``, which loses only the time since its checkpoint. Either way the victim's
attempt carries ``gpuquotaLostWork`` and ``/metrics`` counts it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuquota.core.checkpoints import LEAST_LOST_WORK, VICTIM_ORDER_TAG
from gpuquota.ctl.api import Api
from gpuquota.testing import GpuquotaStack, StackOptions, start_stack
from tests.e2e.conftest import G5, Jobs, poll
from tests.gateway.helpers import create_queue, create_share, submit
from tests.observe.helpers import scrape, value

CHECKPOINTER = """\
import json, os, pathlib, signal, sys, time
out, ckpt = pathlib.Path(os.environ["OUT_DIR"]), pathlib.Path(os.environ["SM_CHECKPOINT_DIR"])
name, attempt = os.environ["GPUQUOTA_JOB_NAME"], os.environ["GPUQUOTA_ATTEMPT"]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
(out / f"{name}.{attempt}.start").write_text(json.dumps({"pid": os.getpid()}))
asked = out / f"{name}.checkpoint"
while True:
    if asked.exists() and not (ckpt / "model.pt").exists():
        (ckpt / "model.pt").write_text("weights")
    time.sleep(0.05)
"""


def payload(jobs: Jobs) -> str:
    return json.dumps(
        {
            "AlgorithmSpecification": {"ContainerEntrypoint": [sys.executable, "-S", "-c", CHECKPOINTER]},
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
            "Environment": {"OUT_DIR": str(jobs.out)},
        }
    )


def attempt_of(api: Api, job_id: str) -> dict[str, Any]:
    """The job's first attempt with gpuquota's keys (boto3 alone drops them)."""
    attempts: list[dict[str, Any]] = api.call("describe_service_job", jobId=job_id).get("attempts") or []
    return attempts[0] if attempts else {}


@pytest.mark.parametrize("order", [None, LEAST_LOST_WORK])
@pytest.mark.parametrize("mode", ["embedded", pytest.param("distributed", marks=pytest.mark.integration)])
def test_reclaim_takes_the_victim_the_order_says_and_records_its_lost_work(
    mode: str, order: str | None, request: pytest.FixtureRequest, jobs: Jobs, tmp_path: Path
) -> None:
    kafka = database_url = None
    if mode == "distributed":  # heartbeats over Kafka, the log in PostgreSQL
        kafka = request.getfixturevalue("kafka_bootstrap")
        database_url = request.getfixturevalue("database_url")
    options = StackOptions(
        mode="distributed" if mode == "distributed" else "embedded",
        nodes=f"{G5}=3",
        runtime="process",
        kafka=kafka,
        database_url=database_url,
    )
    with start_stack(options, tmp_path / "stack") as stack:
        play(stack, jobs, order)


def play(stack: GpuquotaStack, jobs: Jobs, order: str | None) -> None:
    batch, api = stack.batch, Api(stack.endpoint_url)
    create_queue(batch)
    create_share(batch, "QS1", "LEND_AND_BORROW", borrow=200)
    create_share(batch, "QS2", "LEND", tags={VICTIM_ORDER_TAG: order} if order else {})
    create_share(batch, "QS3", "RESERVE")
    ids = {}
    for name in ("old", "new"):
        ids[name] = submit(batch, name, "QS1", serviceRequestPayload=payload(jobs))
        stack.wait_for_status(ids[name], "RUNNING", timeout=60)
    (jobs.out / "old.checkpoint").write_text("now")
    checkpointed = poll(
        lambda: attempt_of(api, ids["old"]).get("gpuquotaCheckpointAt"), 60, "old's checkpoint to be reported"
    )
    assert "gpuquotaCheckpointAt" not in attempt_of(api, ids["new"])
    new_started = attempt_of(api, ids["new"])["startedAt"]
    assert checkpointed > new_started  # so old loses less than new, whenever the reclaim comes

    ids["reclaimer"] = submit(batch, "reclaimer", "QS2", serviceRequestPayload=payload(jobs))
    victim, spared = ("old", "new") if order == LEAST_LOST_WORK else ("new", "old")
    job = stack.wait_for_status(ids[victim], "RUNNABLE", timeout=60)
    decided = time.time() * 1000
    assert job["preemptionSummary"]["preemptedAttemptCount"] == 1
    assert batch.describe_service_job(jobId=ids[spared])["status"] == "RUNNING"
    stack.wait_for_status(ids["reclaimer"], "RUNNING", timeout=60)

    lost = attempt_of(api, ids[victim])["gpuquotaLostWork"]
    saved_at = checkpointed if victim == "old" else new_started
    assert lost["kind"] == "CROSS_SHARE" and lost["gpus"] == 1
    assert 0 < lost["seconds"] <= (decided - saved_at) / 1000
    assert lost["gpuSeconds"] == lost["seconds"] * lost["gpus"]
    explained = api.explain(ids[victim])
    assert explained["lastPreemption"]["lostWork"] == lost
    samples = scrape(stack.endpoint_url)
    counted = value(
        samples, "gpuquota_preemption_lost_gpu_seconds_total", queue="jq", share="QS1", kind="CROSS_SHARE"
    )
    assert counted == pytest.approx(lost["gpuSeconds"])
