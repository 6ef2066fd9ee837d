"""The pool's slot counters and free-slot index (``pool_slots``, ``pool_free``, ``free_index``).

``evolve``'s helpers for events that change which nodes are usable (a registration, a drain, a lost
node, a training plan's window, S11): a usable node's slots count, an unusable node's do not. Called
only from ``evolve``, which stays the only code that mutates a ``ClusterState``.
"""

from __future__ import annotations

from gpuquota.core.state import ClusterState, NodeRecord


def reindex(state: ClusterState, node: NodeRecord, unit: str, before: int) -> None:
    """Keep ``free_index`` in step with ``node.free[unit]`` (``before``: its size before the change)."""
    index = state.child(state.free_index, (node.pool, unit), list)
    if before:
        state.list_discard(index, (before, node.node_id))
    after = len(node.free.get(unit, ()))
    if after and node.usable:
        state.list_insort(index, (after, node.node_id))


def count_slots(node: NodeRecord) -> dict[str, int]:
    counts: dict[str, int] = {}
    for slot in node.slots:
        counts[slot.unit] = counts.get(slot.unit, 0) + 1
    return counts


def withdraw(state: ClusterState, node: NodeRecord) -> None:
    """Take a usable node's slots out of the pool counters (it drains, leaves or is replaced)."""
    _count_node(state, node, -1)


def contribute(state: ClusterState, node: NodeRecord) -> None:
    """Add a usable node's slots to the pool counters (it registers or is undrained)."""
    _count_node(state, node, 1)


def _count_node(state: ClusterState, node: NodeRecord, sign: int) -> None:
    if not node.usable:
        return
    slots = state.child(state.pool_slots, node.pool, dict)
    free_counts = state.child(state.pool_free, node.pool, dict)
    for unit, count in count_slots(node).items():
        free = len(node.free.get(unit, ()))
        state.dict_add(slots, unit, sign * count)
        state.dict_add(free_counts, unit, sign * free)
        if sign > 0:
            reindex(state, node, unit, 0)
        elif (index := state.free_index.get((node.pool, unit))) is not None:
            state.list_discard(index, (free, node.node_id))
