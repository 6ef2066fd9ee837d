"""``fast_construct`` builds what pydantic's ``model_construct`` builds, for every model it is used on."""

from __future__ import annotations

from typing import Any

from gpuquota.wire import events as ev
from gpuquota.wire.base import JobSpec
from gpuquota.wire.fast_construct import fast_construct
from tests.builders import Harness, job


def test_every_decided_event_is_what_model_construct_builds() -> None:
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("u").share("NOPE"))
    assert {type(e) for e in h.events} >= {ev.JobAccepted, ev.InputRejected, ev.QuotaShareChanged}
    for event in [*h.events, *h.inputs]:
        fields = dict(event)
        built, constructed = fast_construct(type(event), dict(fields)), type(event).model_construct(**fields)
        assert built == constructed == event
        assert built.model_dump_json() == constructed.model_dump_json()
        assert built.model_fields_set == constructed.model_fields_set
        assert built.__pydantic_extra__ is None and built.__pydantic_private__ is None


def test_a_default_factory_makes_a_new_value_for_each_model() -> None:
    fields: dict[str, Any] = {
        "job_id": "j",
        "job_name": "j",
        "job_queue": "q",
        "quota_share": "s",
        "unit": "u",
        "created_at": 5,
    }
    first, second = fast_construct(JobSpec, dict(fields)), fast_construct(JobSpec, dict(fields))
    assert first == JobSpec.model_construct(**fields) and first.tags == {}
    assert first.tags is not second.tags
    assert first.model_dump_json() == JobSpec.model_construct(**fields).model_dump_json()
