"""How an attempt's end becomes its final report: status, ``statusReason`` and exit code."""

from __future__ import annotations

import signal

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.node_agent.launch import Outcome
from gpuquota.wire.inputs import AttemptStatus

FinalStatus = tuple[AttemptStatus, str | None, int | None]
"""(status, reason, exit code) of a final ``AttemptReport``."""


def final_status(
    outcome: Outcome, stop_reason: str | None, timed_out_after: float | None
) -> FinalStatus | None:
    """The final report of an attempt that ended with ``outcome``; None when its exit status is unknown.

    ``stop_reason``: the agent was stopping it (STOPPED); ``timed_out_after``: it exceeded its
    ``MaxRuntimeInSeconds`` (FAILED).
    """
    code = exit_code(outcome)
    if stop_reason is not None:
        return "STOPPED", stop_reason, code
    if timed_out_after is not None:
        return (
            "FAILED",
            f"Attempt exceeded StoppingCondition.MaxRuntimeInSeconds ({timed_out_after:g} s)",
            code,
        )
    if outcome.exit_code == 0:
        return "SUCCEEDED", None, 0
    if outcome.signal is not None:
        detail = outcome.reason or f"killed by signal {signal_name(outcome.signal)}"
        return "FAILED", algorithm_error(detail), code
    if outcome.exit_code is not None:
        return "FAILED", algorithm_error(outcome.reason or f"exited with code {outcome.exit_code}"), code
    return None


def exit_code(outcome: Outcome) -> int | None:
    if outcome.signal is not None:
        return 128 + outcome.signal
    return outcome.exit_code


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
