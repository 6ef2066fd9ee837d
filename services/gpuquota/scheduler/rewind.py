"""Reading again the inputs a shortened log lost: Kafka's committed offsets back to the log's positions.

Theory of operation
-------------------
The scheduler acks an input only once its append committed, and faust commits acked offsets, so
Kafka's committed offset of a partition is never past what the log recorded, as long as the log keeps
what it committed. A log that lost its end (a crash without durable commits, a failover to an
asynchronous replica, a restore from backup) lost the consumer positions recorded with those records
too (``consumer_positions`` is written in the same transaction), while the committed offsets stay past
them: the inputs of the lost records would never be read again, and an acknowledged submission would
vanish. So when partitions are assigned, before the scheduler reads them, each partition whose
committed offset is past the log's position is committed back to it and read from there
(``rewind``): the lost inputs are decided again, the node agents' reports among them, which tell what
ran meanwhile (``core.lost_tail`` adopts a success the shorter log does not know of), and what the log
holds is skipped by the recorded positions, as after any restart.

The log's position of a partition (``log_positions``) is the *least* next offset over the pools
recorded on it: every pool's log lost its end at once, and what a pool recorded is skipped anyway
(a pool idle for long on a busy partition makes that a long read, of records all skipped).
The committed offset is also past the log's position by the trailing inputs that decided nothing
(heartbeats, never recorded): those are read again too, and decide nothing again. The check runs in
the rebalance (the consumer must not read before it): an unreachable database is retried for at
most ``seconds``, then the check is skipped with an error in the log (a lost tail during a database
outage at a rebalance is not read again).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from faust.types import TP

from gpuquota.adapters.event_store import EventStore
from gpuquota.scheduler.loop import LoopFailed, RetryPolicy

log = logging.getLogger(__name__)


async def log_positions(
    store: EventStore, held: Iterable[tuple[str, int]], retry: RetryPolicy
) -> dict[TP, int]:
    """Per partition in ``held`` with recorded pools: the least next offset the log recorded on it."""
    found: dict[TP, int] = {}
    for topic, partition in held:
        pools = await retry.call(functools.partial(store.pools_at, topic, partition), "rewind: pools")
        for pool in pools:
            recorded = await retry.call(functools.partial(store.positions, pool), f"rewind: pool {pool}")
            position = recorded.get((topic, partition))
            if position is not None:
                tp = TP(topic, partition)
                found[tp] = min(position, found.get(tp, position))
    return found


async def rewind(consumer: Any, positions: Mapping[TP, int]) -> int:
    """Commit each partition of ``positions`` whose committed offset is past it back to it and seek
    there (faust's consumer); how many offsets will be read again."""
    committed = await consumer.seek_to_committed()
    back = {tp: at for tp, at in positions.items() if (ahead := committed.get(tp)) is not None and ahead > at}
    if not back:
        return 0
    again = 0
    for tp, at in sorted(back.items()):
        ahead = committed[tp]
        again += ahead - at
        log.warning(
            "partition %s/%d: the committed offset %d is past the event log's position %d: reading the"
            " %d inputs after it again (inputs that decided nothing, or records the log lost)",
            tp.topic, tp.partition, ahead, at, ahead - at,
        )  # fmt: skip
    await consumer._commit(back)  # faust's commit of given offsets (its public commit takes acked ones)
    await consumer.perform_seek()  # to the committed offsets, and faust's read and committed marks with them
    return again


async def rewind_assigned(
    consumer: Any, store: EventStore, held: Iterable[tuple[str, int]], seconds: float
) -> int:
    """``rewind`` the partitions in ``held`` to the log's positions; 0 (logged) if the database stays
    unreachable for ``seconds``."""
    retry = RetryPolicy(seconds, warn=log.warning)
    try:
        positions = await log_positions(store, held, retry)
    except LoopFailed as exc:
        log.error("%s: not checking whether the event log lost inputs Kafka has as committed", exc)
        return 0
    return await rewind(consumer, positions)
