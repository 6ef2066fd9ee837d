"""Which of the node agent's queued inputs go out together when it sends in batches (``send_many``).

A batch is sent at once (the embedded shell records it in one group commit), and when one input of it
fails, those after it may have been delivered all the same; the agent then sends the failed one again
and everything after it (the scheduler skips a repeated input by its event id). So that this never
reorders one job's reports, a batch holds at most one report per attempt; a registration, a drain or a
deregistration goes alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from gpuquota.wire.inputs import AttemptReport, SchedulerInput

Send = Callable[[SchedulerInput], Awaitable[object]]
SendMany = Callable[[list[SchedulerInput]], Awaitable[list[BaseException | None]]]  # in order; None: sent

LOST_REASON = "Attempt lost: the node agent restarted while it ran (exit status unknown)"
"""Kept for readers of older logs: a restarted agent no longer reports this (``agent`` module doc)."""

BATCH_LIMIT = 500


def head_batch(outbox: Iterable[SchedulerInput], limit: int = BATCH_LIMIT) -> list[SchedulerInput]:
    """The longest head of ``outbox`` that can be sent as one batch (at least its first input)."""
    batch: list[SchedulerInput] = []
    attempts: set[str] = set()
    for message in outbox:
        if not isinstance(message, AttemptReport):
            return batch or [message]
        if message.attempt_id in attempts or len(batch) >= limit:
            break
        attempts.add(message.attempt_id)
        batch.append(message)
    return batch
