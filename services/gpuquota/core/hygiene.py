"""Preemption hygiene (semantics S10): gpuquota extensions against thrash, off unless a quota share
opts in with a tag (AWS reclaims at once; the default stays AWS's behaviour).

- ``gpuquota:minRuntimeSeconds=N``: a job of the share is not chosen as a victim (cross-share or
  in-share) until N seconds after its current attempt was dispatched (``scheduledAt``: the attempt
  holds its capacity from then on, whether its node has reported it RUNNING yet or not). A preemptor
  that only such jobs could serve waits; ``protected_until`` says until when.
- ``gpuquota:reborrowBackoffSeconds=N``: after a job of the share was reclaimed (cross-share), the
  share may not borrow for N seconds, doubling on each further reclaim within 10 N of the previous
  one (at most ``MAX_DOUBLINGS`` times), back to N after 10 N quiet seconds. ``ShareRecord.backoff``
  holds it; ``evolve`` derives it from ``JobPreempted`` events, so replay rebuilds it.

Both depend on time, which the core only learns from inputs: a ``Tick`` revisits the units of shares
that use them (``touch_timed_units``), so that a protection or a backoff that ends is acted on.
"""

from __future__ import annotations

from typing import Final

from gpuquota.core.state import ClusterState, JobRecord, ShareRecord

MIN_RUNTIME_TAG: Final = "gpuquota:minRuntimeSeconds"
REBORROW_BACKOFF_TAG: Final = "gpuquota:reborrowBackoffSeconds"
MAX_SECONDS: Final = 7 * 24 * 3600
MAX_DOUBLINGS: Final = 6
QUIET_FACTOR: Final = 10


def tag_problem(tags: dict[str, str]) -> str | None:
    """Why the hygiene tags of a quota share are invalid, or None (whole seconds, 0 to a week)."""
    for tag in (MIN_RUNTIME_TAG, REBORROW_BACKOFF_TAG):
        value = tags.get(tag)
        if value is not None and not (value.isdigit() and int(value) <= MAX_SECONDS):
            return f"Tag {tag} must be a whole number of seconds from 0 to {MAX_SECONDS}, not {value!r}"
    return None


def _seconds(share: ShareRecord, tag: str) -> int:
    value = share.spec.tags.get(tag)
    return int(value) if value is not None and value.isdigit() else 0


def min_runtime_ms(share: ShareRecord) -> int:
    return _seconds(share, MIN_RUNTIME_TAG) * 1000


def reborrow_backoff_ms(share: ShareRecord) -> int:
    return _seconds(share, REBORROW_BACKOFF_TAG) * 1000


def protected_until(state: ClusterState, victim: JobRecord, now: int) -> int | None:
    """When ``victim`` may be preempted, if it is protected by its share's minimum runtime now."""
    minimum = min_runtime_ms(state.shares[victim.share])
    if not minimum or victim.scheduled_at is None:
        return None
    until = victim.scheduled_at + minimum
    return until if now < until else None


def borrow_blocked_until(share: ShareRecord, now: int) -> int | None:
    """When the share may borrow again, if its reborrow backoff holds now."""
    backoff = share.backoff
    return backoff[0] if backoff is not None and now < backoff[0] else None


def next_backoff(share: ShareRecord, at: int) -> tuple[int, int, int] | None:
    """The share's backoff after one of its jobs is reclaimed at ``at``: (until, length, at)."""
    base = reborrow_backoff_ms(share)
    if not base:
        return None
    previous = share.backoff
    length = base
    if previous is not None and at - previous[2] <= QUIET_FACTOR * base:
        length = min(previous[1] * 2, base << MAX_DOUBLINGS)
    return (at + length, length, at)


def timed_units(state: ClusterState) -> set[str]:
    """Units of shares whose hygiene depends on time: a tick must revisit them."""
    units: set[str] = set()
    for share in state.shares.values():
        if share.spec.tags and (min_runtime_ms(share) or share.backoff is not None):
            units.update(share.limits)
    return units
