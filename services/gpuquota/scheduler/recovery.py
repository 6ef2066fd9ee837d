"""Loading a pool in the distributed mode: the latest snapshot, the log after it, and republication.

Publishing happens after the append, so a crash between the two loses publications, never decisions.
Loading a pool closes that gap: it folds the latest snapshot plus the log after it (``fold_log``) and
publishes the tail's job events and input results again, and its node commands that still matter (a
``RunAttempt`` whose attempt is still only SCHEDULED, every ``StopAttempt``, a ``RegisterAgain`` while
its node is still lost). A snapshot is saved only once every publication up to its sequence is
acknowledged by the broker, so nothing before a snapshot needs publishing again.

The tail is republished page by page as it is folded (``Republication``), not collected whole: a pool
loaded from its whole log (no snapshot, or one that cannot be read) would otherwise hold every event
of its history at once, each with its job-state record and its input's result, until the end
(``benchmarks.recovery``: 4.1 GB of RSS for 1,000,000 events; 79 MB, the process's own, with pages).
Node commands wait for the end of the tail, since whether one still matters is known only from the
state there; a ``RunAttempt`` whose attempt has moved on is dropped at once (it never becomes current
again).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field

from gpuquota.adapters.event_store import EventStore, Record
from gpuquota.adapters.log_fold import fold_log
from gpuquota.adapters.snapshots import SnapshotError, load_state
from gpuquota.core import ClusterState
from gpuquota.scheduler.loop import Effects, Publisher, answers
from gpuquota.scheduler.pools import PoolRuntime
from gpuquota.support.clock import Clock
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

    again = Republication(effects, state, publisher)
    seq, tail = await fold_log(store, pool, state, seq, before=before, after=answered, after_page=again.page)
    runtime = PoolRuntime(pool, state, seq, await store.positions(pool))
    await again.page(end=True)
    log.info(
        "pool %s: loaded at sequence %d (snapshot %s, %d records after it; republished %d)",
        pool, seq, None if snapshot is None else snapshot.seq, tail, again.records_and_commands,
    )  # fmt: skip
    # a long tail is snapshotted with the next decided input (as due), not here: dumping a large
    # state would double the time before the pool decides again
    runtime.since_snapshot = tail
    return runtime, again.deliveries, again.records_and_commands + again.results


@dataclass
class Republication:
    """The tail's effects, published after each page of the fold and then forgotten."""

    effects: Effects
    state: ClusterState
    publisher: Publisher
    deliveries: list[Awaitable[object]] = field(default_factory=list)
    records_and_commands: int = 0
    results: int = 0

    async def page(self, end: bool = False) -> None:
        """Publish the job-state records and results collected so far; the node commands that still
        matter only at the ``end`` of the tail (before it, only the stale ``RunAttempt`` ones are dropped)."""
        effects, page = self.effects, Effects()
        page.records, effects.records = effects.records, []
        page.results, effects.results = effects.results, []
        if end:
            page.commands = [c for c in effects.commands if still_needed(self.state, c)]
            effects.commands = []
        else:
            effects.commands = [c for c in effects.commands if not stale_run(self.state, c)]
        self.records_and_commands += len(page.records) + len(page.commands)
        self.results += len(page.results)
        self.deliveries.extend(await page.publish(self.publisher))


def stale_run(state: ClusterState, command: NodeCommand) -> bool:
    """A ``RunAttempt`` whose attempt is no longer current and SCHEDULED: it never is again (attempt
    ids are not reused), so it is dropped in the middle of the tail already."""
    return isinstance(command, RunAttempt) and not still_needed(state, command)


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
