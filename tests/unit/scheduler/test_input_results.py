"""Every input gets exactly one answer (``InputResult``), correlated by its event id (issue #18)."""

from __future__ import annotations

from gpuquota.adapters.event_store import InMemoryEventStore
from gpuquota.scheduler.pipeline import Outcome
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.input_results import DecidedEvent, InputResult
from tests.builders import Harness, job
from tests.unit.scheduler.test_pipeline import FakePublisher, feed, pipeline, records


def by_input(results: list[InputResult]) -> dict[str, list[InputResult]]:
    out: dict[str, list[InputResult]] = {}
    for result in results:
        out.setdefault(result.input_event_id, []).append(result)
    return out


def scenario() -> Harness:
    """The worked example's resources, a job accepted, one refused, a priority change, a bad one."""
    h = Harness.worked_example()
    h.submit(job("a").share("QS1"), job("u").share("NOPE"))
    h.set_priority("a", 7)
    h.set_priority("nobody", 1)
    return h


async def test_every_input_is_answered_once_accepted_or_rejected_with_the_http_text() -> None:
    h = scenario()
    publisher = FakePublisher()
    outcomes = await feed(pipeline(InMemoryEventStore(), publisher), records(h.inputs))

    assert set(outcomes) == {Outcome.DECIDED}
    answers = by_input(publisher.results)
    assert list(answers) == [m.event_id for m in h.inputs]  # one each, in input order
    assert all(len(a) == 1 for a in answers.values())
    submit_a, submit_u, priority_a, priority_nobody = h.inputs[-4:]
    (accepted,) = answers[submit_a.event_id]
    assert (accepted.outcome, accepted.job_id, accepted.pool) == ("ACCEPTED", "a", "p")
    assert [e.type for e in accepted.events][:2] == ["JobAccepted", "JobDispatched"]
    assert accepted.event_id == f"result/{submit_a.event_id}"
    (refused,) = answers[submit_u.event_id]
    assert (refused.outcome, refused.job_id) == ("REJECTED", "u")
    # the message of the HTTP API's ClientException for the same input:
    assert refused.reason == "Quota share NOPE does not exist in job queue jq"
    assert answers[priority_a.event_id][0].events[0].type == "JobPriorityChanged"
    assert answers[priority_nobody.event_id][0].reason == "Job nobody does not exist or has finished"


async def test_job_events_name_the_input_that_caused_them() -> None:
    h = scenario()
    publisher = FakePublisher()
    await feed(pipeline(InMemoryEventStore(), publisher), records(h.inputs))

    submit_a = h.inputs[-4]
    caused = [r for r in publisher.records if r.cause == submit_a.event_id]
    assert [type(r.event) for r in caused] == [ev.JobAccepted, ev.JobDispatched]
    assert all(r.cause for r in publisher.records)


async def test_a_redelivered_or_reproduced_input_is_not_answered_again() -> None:
    h = scenario()
    publisher = FakePublisher()
    p = pipeline(InMemoryEventStore(), publisher)
    await feed(p, records(h.inputs))
    answered = len(publisher.results)

    assert set(await feed(p, records(h.inputs[-2:], start=len(h.inputs) - 2))) == {Outcome.SKIPPED}
    assert await feed(p, records(h.inputs[-1:], start=len(h.inputs))) == [Outcome.DUPLICATE]
    assert len(publisher.results) == answered


async def test_recovery_republishes_the_answers_of_the_tail_with_the_same_ids() -> None:
    h = scenario()
    store, first = InMemoryEventStore(), FakePublisher()
    await feed(pipeline(store, first, snapshot_every=10_000), records(h.inputs))

    again = FakePublisher()
    await pipeline(store, again, snapshot_every=10_000).assigned([("in", 0)])
    assert {r.event_id for r in again.results} == {r.event_id for r in first.results}


async def test_an_undecodable_input_with_an_event_id_is_answered_rejected() -> None:
    publisher = FakePublisher()
    p = pipeline(InMemoryEventStore(), publisher)
    bad = (
        b'{"type": "UpdateJobPriority", "event_id": "e-1", "occurred_at": 1, "job_id": "j", "priority": "hi"}'
    )
    (record,) = records([bad])

    assert await p.handle(record) is Outcome.DEAD_LETTER
    (result,) = publisher.results
    assert (result.input_event_id, result.outcome, result.job_id) == ("e-1", "REJECTED", "j")
    assert result.reason == publisher.letters[0][0].reason
    assert await p.handle(records([b"{not json"], start=1)[0]) is Outcome.DEAD_LETTER
    assert len(publisher.results) == 1  # no event id: nothing to answer to


async def test_heartbeats_are_answered_only_when_rejected() -> None:
    h = Harness.basic(capacity=2, nodes=1)
    publisher = FakePublisher()
    p = pipeline(InMemoryEventStore(), publisher)
    await feed(p, records(h.inputs))
    beats = [
        inp.NodeHeartbeat(event_id="beat-ok", occurred_at=h.now + 60_000, node_id="node-0"),
        inp.NodeHeartbeat(event_id="beat-unknown", occurred_at=h.now + 60_001, node_id="node-9"),
    ]
    await feed(p, records(beats, start=len(h.inputs)))

    answered = by_input(publisher.results)
    assert "beat-ok" not in answered and answered["beat-unknown"][0].outcome == "REJECTED"


async def test_a_batch_answers_each_input_and_names_each_cause() -> None:
    h = scenario()
    publisher = FakePublisher()
    outcomes = await pipeline(InMemoryEventStore(), publisher).handle_batch(records(h.inputs))

    assert set(outcomes) == {Outcome.DECIDED}
    assert [r.input_event_id for r in publisher.results] == [m.event_id for m in h.inputs]
    for record in publisher.records:  # event ids are "<input id>/<n>": the cause is the input's id
        assert record.cause == record.event.event_id.rsplit("/", 1)[0]


async def test_answers_validate_even_for_the_longest_input_ids() -> None:
    h = Harness.worked_example()  # no dispatch: a RunAttempt's id (input id + node id) would not fit
    h.submit(job("u").share("NOPE"))
    h.set_priority("nobody", 1)
    longest = [m.model_copy(update={"event_id": f"{i:03d}" + "x" * 253}) for i, m in enumerate(h.inputs)]
    publisher = FakePublisher()
    await feed(pipeline(InMemoryEventStore(), publisher), records(longest))

    assert len(publisher.results) == len(longest)
    for result in publisher.results:  # built without validation: validate them now
        assert InputResult.model_validate_json(result.model_dump_json()) == result


async def test_answers_are_what_model_construct_would_build() -> None:
    h = scenario()
    publisher = FakePublisher()
    await feed(pipeline(InMemoryEventStore(), publisher), records(h.inputs))

    assert {r.outcome for r in publisher.results} == {"ACCEPTED", "REJECTED"}
    for result in publisher.results:  # built through BaseModel's slots, not model_construct: the same
        fields = {name: getattr(result, name) for name in result.model_fields_set}
        events = tuple(DecidedEvent.model_construct(**e.model_dump()) for e in result.events)
        constructed = InputResult.model_construct(**{**fields, "events": events})
        assert result == constructed and result.model_fields_set == constructed.model_fields_set
        assert result.model_dump_json() == constructed.model_dump_json()
        assert result.__pydantic_extra__ is None and result.__pydantic_private__ is None
        for event in result.events:
            assert event.model_fields_set == {"type", "event_id"}
            assert event == DecidedEvent(type=event.type, event_id=event.event_id)
