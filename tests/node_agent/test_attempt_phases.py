"""The node agent's attempt phases (``node_agent.records.ATTEMPT_TRANSITIONS``)."""

from __future__ import annotations

import pytest

from gpuquota.node_agent.records import ATTEMPT_TRANSITIONS, Attempt, AttemptPhase, IllegalAttemptTransition
from gpuquota.wire.node_commands import RunAttempt


def attempt() -> Attempt:
    command = RunAttempt(
        event_id="e1",
        occurred_at=1,
        node_id="n1",
        job_id="j1",
        job_name="j1",
        attempt_id="a1",
        attempt_number=1,
        unit="ml.g5.xlarge",
        slots=(0,),
        gpus=(),
        payload="",
    )
    return Attempt(command=command)


def test_every_phase_can_end_and_nothing_leaves_the_end() -> None:
    assert set(ATTEMPT_TRANSITIONS) == set(AttemptPhase)
    for phase, following in ATTEMPT_TRANSITIONS.items():
        assert (AttemptPhase.ENDED in following) is (phase is not AttemptPhase.ENDED)
    assert ATTEMPT_TRANSITIONS[AttemptPhase.ENDED] == frozenset()


def test_a_stop_request_counts_once_and_not_after_the_end() -> None:
    att = attempt()
    assert att.stoppable
    att.move(AttemptPhase.RUNNING)
    att.move(AttemptPhase.STOP_REQUESTED)
    assert not att.stoppable
    with pytest.raises(IllegalAttemptTransition):
        att.move(AttemptPhase.RUNNING)  # a stopped attempt never runs again
    att.move(AttemptPhase.ENDED)
    att.move(AttemptPhase.ENDED)  # the same phase again changes nothing
    assert not att.stoppable
    with pytest.raises(IllegalAttemptTransition):
        att.move(AttemptPhase.STOP_REQUESTED)
