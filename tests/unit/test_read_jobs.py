"""The read model's compact job (``gpuquota.read.jobs``): it answers what the decoded spec said."""

from __future__ import annotations

from gpuquota.read.jobs import HISTORY, JobView
from gpuquota.wire.base import ExitRule, JobSpec, JobStatus
from gpuquota.wire.inputs import INPUT_ADAPTER, SubmitJob
from tests.builders import job


def test_the_spec_comes_back_as_it_was_decoded_with_its_fields_given() -> None:
    spec = (
        job("a")
        .share("QS1")
        .needs(2)
        .build(created_at=5)
        .model_copy(
            update={
                "tags": {"team": "vision"},
                "evaluate_on_exit": (ExitRule(action="RETRY", on_status_reason="Capacity*"),),
                "payload": '{"TrainingJobName": "x"}',
                "client_token": "t-1",
            }
        )
    )
    decoded = INPUT_ADAPTER.validate_json(SubmitJob(event_id="i", occurred_at=5, job=spec).model_dump_json())
    assert isinstance(decoded, SubmitJob)
    view = JobView(decoded.job)
    assert view.spec == decoded.job
    assert view.spec.model_fields_set == decoded.job.model_fields_set
    assert (view.job_id, view.job_queue, view.quota_share, view.count) == ("a", "jq", "QS1", 2)
    assert view.spec is not view.spec  # rendered on demand, so a caller cannot change what is kept


def test_tags_are_the_jobs_own_and_an_empty_set_is_not_kept() -> None:
    view = JobView(job("a").build(created_at=0), tags={})
    assert view.tags == {} and view.spec.tags == {}
    view.tags = {"k": "v"}
    assert view.tags == {"k": "v"} and view.spec.tags == {}


def test_history_starts_submitted_and_keeps_the_newest_changes() -> None:
    view = JobView(JobSpec(job_id="a", job_name="a", job_queue="q", quota_share="s", unit="u", created_at=7))
    assert view.history == []
    for at in range(1, HISTORY + 5):
        view.status = JobStatus.RUNNABLE if at % 2 else JobStatus.SCHEDULED
        view.note_status(at)
    assert view.history[-1] == (HISTORY + 4, "SCHEDULED")
    assert len(view.history) == HISTORY
    fresh = JobView(JobSpec(job_id="b", job_name="b", job_queue="q", quota_share="s", unit="u", created_at=7))
    fresh.status = JobStatus.RUNNABLE
    fresh.note_status(9)
    assert fresh.history == [(7, "SUBMITTED"), (9, "RUNNABLE")]
