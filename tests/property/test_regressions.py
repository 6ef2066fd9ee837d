"""Failing cases Hypothesis found once, replayed step by step on every run (its database is not kept
in CI, so a rare case it found would otherwise be found again only by chance).

Each file in ``regressions/`` is the "Failing test case" Hypothesis printed for ``SchedulerMachine``
(``test_invariants.py``), with its strategy reprs written as names; the replay runs every rule and
invariant in that order and the teardown (replay and liveness checks).

- ``reclaim_counted_a_hold_*``: a cross-share reclaim preempted a job of a share exactly at its
  limit, because the capacity held for that share's own waiting head (S4.3) was counted as its usage
  (S7.5: "victim share not borrowing").
- ``held_head_passed_stays_unblocked``: a share's head that held victims (never recorded as blocked)
  was passed by a higher-priority submission after its share's limit had fallen below its demand; the
  pass looked only at the jobs that entered, so it was not recorded as blocked behind the new head
  until a full pass ("a full pass still decides [JobBlocked ...]", S9.1).
- ``terminate_frees_a_victim_search``: terminating a running job of a borrowing share took it out
  of the victim lists without a pass; S4.1's search over the remaining victims would now have found
  one for a waiting head of another share ("a full pass still decides [JobPreempted ...]", S3.3).
- ``in_share_stop_frees_a_victim_search``: the same within one pass: an in-share preemption (phase 4)
  stopped a job after the reclaim phase had given up, and only the next pass reclaimed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuquota.wire.base import Strategy
from tests.property.test_invariants import SchedulerMachine

CASES = sorted((Path(__file__).parent / "regressions").glob("*.py.txt"))


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".py.txt") for c in CASES])
def test_found_case_holds_its_invariants(case: Path) -> None:
    steps = compile(case.read_text(), str(case), "exec")
    exec(steps, {"SchedulerMachine": SchedulerMachine, "Strategy": Strategy})  # our own recorded steps


def test_there_are_cases() -> None:
    assert CASES
