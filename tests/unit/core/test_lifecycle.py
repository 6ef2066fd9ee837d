"""The job transition table (``core.lifecycle.JOB_TRANSITIONS``) and ``evolve``'s check against it."""

from __future__ import annotations

import random

import pytest

from benchmarks import core as workload
from gpuquota.core import ClusterState, evolve
from gpuquota.core.evolve import handled_event_types
from gpuquota.core.lifecycle import JOB_TRANSITIONS, NEW, IllegalTransition
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobStatus

NOT_A_JOB_TRANSITION = {ev.InputRejected, ev.AttemptFenced, ev.PreemptionHoldReleased}
"""Events that name a job without changing it: a refused input, a fenced report, a released hold."""


def test_every_event_about_one_job_has_a_row() -> None:
    naming_a_job = {t for t in handled_event_types() if "job_id" in t.model_fields or t is ev.JobAccepted}
    assert set(JOB_TRANSITIONS) == naming_a_job - NOT_A_JOB_TRANSITION


def test_a_job_is_created_runnable_and_succeeds_from_any_live_status() -> None:
    assert JOB_TRANSITIONS[ev.JobAccepted] == (frozenset({NEW}), JobStatus.RUNNABLE)
    assert JOB_TRANSITIONS[ev.JobDispatched][1] is JobStatus.SCHEDULED
    # RUNNABLE too: a success the log lost, adopted from the node's report (core.lost_tail)
    assert JobStatus.RUNNABLE in JOB_TRANSITIONS[ev.JobSucceeded][0]
    assert JOB_TRANSITIONS[ev.JobRequeued][1] is JobStatus.RUNNABLE


def queued_cluster() -> tuple[workload.Driver, ClusterState]:
    driver = workload.Driver(random.Random(3))
    workload.setup_cluster(driver)
    return driver, driver.state


def test_evolve_refuses_an_event_the_job_cannot_take_and_leaves_the_state_alone() -> None:
    driver, state = queued_cluster()
    decided: list[ev.SchedulerEvent] = []
    for index in range(50):
        decided += driver.feed(driver.message(inp.SubmitJob, job=driver.job(index)))
    dispatched = next(e for e in decided if isinstance(e, ev.JobDispatched))
    job = state.jobs[dispatched.job_id]
    assert job.status is JobStatus.SCHEDULED
    applied = state.applied
    with pytest.raises(IllegalTransition, match="JobDispatched .* SCHEDULED"):
        evolve(state, dispatched)  # dispatched twice
    assert job.status is JobStatus.SCHEDULED and state.applied == applied

    accepted_twice = next(e for e in decided if isinstance(e, ev.JobAccepted) and e.job.job_id == job.job_id)
    with pytest.raises(IllegalTransition, match="JobAccepted"):
        evolve(state, accepted_twice)
