"""Loading a pool in the distributed mode: the latest snapshot, the log after it, and republication.

Publishing happens after the append, so a crash between the two loses publications, never decisions.
Loading a pool closes that gap: it folds the latest snapshot plus the log after it (``fold_log``) and
publishes the tail's job events and input results again, and its node commands that still matter (a
``RunAttempt`` whose attempt is still only SCHEDULED, every ``StopAttempt``, a ``RegisterAgain`` while
its node is still lost). A snapshot is saved only once every publication up to its sequence is
acknowledged by the broker, so nothing before a snapshot needs publishing again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from gpuquota.adapters.event_store import EventStore, Record
from gpuquota.adapters.log_fold import fold_log
from gpuquota.adapters.snapshots import SnapshotError, load_state
from gpuquota.clock import Clock
from gpuquota.core import ClusterState
from gpuquota.scheduler.loop import Effects, Publisher, answers
from gpuquota.scheduler.pools import PoolRuntime
from gpuquota.wire.base import JobStatus
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt

log = logging.getLogger(__name__)


async def load_pool(
    store: EventStore, publisher: Publisher, pool: str, heartbeat_timeout_ms: int, clock: Clock
) -> tuple[PoolRuntime, list[Awaitable[object]], int]:
    """The pool's runtime, the deliveries of what it published again, and how many records that was."""
    state, seq = ClusterState(heartbeat_timeout_ms), 0
    snapshot = await store.latest_snapshot(pool)
    if snapshot is not None:
        try:
            state, seq = load_state(snapshot.state), snapshot.seq
        except SnapshotError as exc:
            log.warning("pool %s: ignoring snapshot at %d: %s", pool, snapshot.seq, exc)
    effects = Effects(answers(pool, clock))

    def before(state: ClusterState, event: SchedulerEvent, record: Record) -> None:
        effects.cause = record.input.event_id
        effects.before(state, event)

    def answered(record: Record) -> None:
        effects.answered(record.input, record.events)

    seq, tail = await fold_log(store, pool, state, seq, before=before, after=answered)
    runtime = PoolRuntime(pool, state, seq, await store.positions(pool))
    effects.commands = [c for c in effects.commands if still_needed(state, c)]
    republished = len(effects.records) + len(effects.commands) + len(effects.results)
    deliveries = await effects.publish(publisher)
    log.info(
        "pool %s: loaded at sequence %d (snapshot %s, %d records after it; republished %d)",
        pool, seq, None if snapshot is None else snapshot.seq, tail,
        len(effects.records) + len(effects.commands),
    )  # fmt: skip
    # a long tail is snapshotted with the next decided input (as due), not here: dumping a large
    # state would double the time before the pool decides again
    runtime.since_snapshot = tail
    return runtime, deliveries, republished


def still_needed(state: ClusterState, command: NodeCommand) -> bool:
    """On recovery: a RunAttempt matters only while its attempt is current and not yet reported, a
    RegisterAgain only while its node is unknown or lost."""
    if isinstance(command, RegisterAgain):
        node = state.nodes.get(command.node_id)
        return node is None or not node.online
    if not isinstance(command, RunAttempt):
        return True
    job = state.jobs.get(command.job_id)
    return job is not None and job.attempt_id == command.attempt_id and job.status is JobStatus.SCHEDULED
