"""100 short real processes across 3 node agents, each job exactly once.

Each job runs ``python -S -c SHORT_JOB``: it creates ``$OUT_DIR/<job id>`` in ``x`` mode (a second run
of the same job would fail) holding its node and attempt id, sleeps 50 ms and exits 0. Checked: every
job SUCCEEDED with one attempt (DescribeServiceJob), the scheduler's log holds exactly one
``JobDispatched`` and one ``JobSucceeded`` per job and nothing requeued, failed, fenced or rejected,
every process ran once on the node of its placement, and all three agents ran jobs.

* distributed: three ``gpuquota node-agent`` processes (4 x ``ml.g5.xlarge`` each) over Kafka, the
  log in PostgreSQL;
* embedded: ``gpuquota up``'s stack with ``--nodes`` of three units (it starts one local agent per
  unit), the log in SQLite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.sqlite_store import STORE_FILE, SqliteEventStore
from gpuquota.testing import StackOptions, start_stack
from gpuquota.wire import events as ev
from gpuquota.wire.events import SchedulerEvent
from tests.e2e.conftest import G5, ClusterFactory, Jobs, apoll, log_events, poll

JOBS = 100
SLOTS = 4
QUEUE = "jq"
LAUNCHED = re.compile(r"attempt (\S+): launched \(pid \d+\)")
POLICY_ARN = "arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy"


def create_resources(batch: Any, capacity: dict[str, int]) -> None:
    """One queue on an SE of ``capacity`` (instances per unit), one RESERVE share allowed all of it."""
    limits = [{"capacityUnit": unit, "maxCapacity": count} for unit, count in capacity.items()]
    batch.create_scheduling_policy(name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName="se", serviceEnvironmentType="SAGEMAKER_TRAINING", capacityLimits=limits
    )
    batch.create_job_queue(
        jobQueueName=QUEUE,
        priority=1,
        jobQueueType="SAGEMAKER_TRAINING",
        schedulingPolicyArn=POLICY_ARN,
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )
    batch.create_quota_share(
        quotaShareName="all",
        jobQueue=QUEUE,
        capacityLimits=limits,
        resourceSharingConfiguration={"strategy": "RESERVE"},
        preemptionConfiguration={"inSharePreemption": "DISABLED"},
    )


def submit_all(batch: Any, jobs: Jobs, units: list[str]) -> list[str]:
    def one(i: int) -> str:
        payload = jobs.short(units[i % len(units)])
        return str(
            batch.submit_service_job(
                jobName=f"short-{i}",
                jobQueue=QUEUE,
                serviceJobType="SAGEMAKER_TRAINING",
                quotaShareName="all",
                serviceRequestPayload=payload,
            )["jobId"]
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(JOBS)))


def succeeded(batch: Any) -> int:
    count = 0
    for page in batch.get_paginator("list_service_jobs").paginate(jobQueue=QUEUE, jobStatus="SUCCEEDED"):
        count += len(page["jobSummaryList"])
    return count


def check_descriptions(batch: Any, ids: list[str]) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        described = list(pool.map(lambda job_id: batch.describe_service_job(jobId=job_id), ids))
    assert {d["status"] for d in described} == {"SUCCEEDED"}
    assert [len(d["attempts"]) for d in described] == [1] * JOBS


def check_exactly_once(events: list[SchedulerEvent], ids: list[str], jobs: Jobs, nodes: set[str]) -> None:
    dispatched = [e for e in events if isinstance(e, ev.JobDispatched)]
    assert Counter(e.job_id for e in dispatched) == dict.fromkeys(ids, 1)
    assert len({e.attempt_id for e in dispatched}) == JOBS
    done = Counter(e.job_id for e in events if isinstance(e, ev.JobSucceeded))
    assert done == dict.fromkeys(ids, 1)
    unexpected = (ev.JobRequeued, ev.JobFailed, ev.AttemptFenced, ev.InputRejected, ev.NodeLost)
    assert [e.type for e in events if isinstance(e, unexpected)] == []
    # every process ran once, on the node the scheduler placed its attempt on
    placed = {e.job_id: (e.placements[0].node_id, e.attempt_id) for e in dispatched}
    ran = {p.name: tuple(p.read_text().split()) for p in jobs.out.iterdir() if p.name in placed}
    assert ran == placed
    assert set(Counter(node for node, _ in ran.values())) == nodes


@pytest.mark.integration
async def test_100_short_jobs_across_3_agent_processes(cluster_factory: ClusterFactory, jobs: Jobs) -> None:
    cluster = await cluster_factory(heartbeat_seconds=1.0)
    nodes = [cluster.node_id(f"n{i}") for i in range(1, 4)]
    agents = [cluster.agent(node, f"{G5}={SLOTS}") for node in nodes]
    await asyncio.gather(*(agent.start() for agent in agents))
    await apoll(lambda: cluster.online() == set(nodes), 30, "three nodes to register")
    batch = cluster.batch
    await asyncio.to_thread(create_resources, batch, {G5: 3 * SLOTS})
    ids = await asyncio.to_thread(submit_all, batch, jobs, [G5])

    async def all_succeeded() -> bool:
        return await asyncio.to_thread(succeeded, batch) == JOBS

    await apoll(all_succeeded, 120, f"{JOBS} jobs to succeed", interval=0.2)
    await asyncio.to_thread(check_descriptions, batch, ids)
    check_exactly_once(await cluster.events(), ids, jobs, set(nodes))
    # the agents launched one process per attempt (their log: "attempt ID: launched (pid N)")
    launched = Counter(m for a in agents for m in LAUNCHED.findall(a.tail(10**7)))
    assert len(launched) == JOBS and set(launched.values()) == {1}


def test_100_short_jobs_across_3_embedded_agents(jobs: Jobs, tmp_path: Path) -> None:
    units = [G5, "ml.g5.2xlarge", "ml.g5.4xlarge"]
    options = StackOptions(mode="embedded", nodes=",".join(f"{u}={SLOTS}" for u in units), runtime="process")
    with start_stack(options, tmp_path / "stack") as stack:
        batch = stack.batch
        create_resources(batch, dict.fromkeys(units, SLOTS))
        ids = submit_all(batch, jobs, units)
        poll(lambda: succeeded(batch) == JOBS, 120, f"{JOBS} jobs to succeed", interval=0.2)
        check_descriptions(batch, ids)

    async def read_log() -> list[SchedulerEvent]:
        store = await SqliteEventStore.open(tmp_path / "stack" / STORE_FILE)
        try:
            return await log_events(store, "default")
        finally:
            await store.close()

    check_exactly_once(asyncio.run(read_log()), ids, jobs, {"local-1", "local-2", "local-3"})
