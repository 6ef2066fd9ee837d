"""The journal that lets ``decide`` stay pure over a mutable state.

For speed the state is mutable: copying an aggregate that holds a million queued jobs for every input
would cost far more than deciding. Purity is kept at the boundary instead. Every mutation goes
through the few journalled helpers below (``Journalled`` for the state's own collections, ``Mutable``
for its records' attributes); ``decide`` opens a journal (``ClusterState.trial``), applies the events
it decides (so that later decisions of the same input see earlier ones), and rolls the journal back
before it returns. ``decide(state, input)`` therefore leaves ``state`` exactly as it found it, which the
property tests check with ``fingerprint``.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

from gpuquota.core.sortedkeys import SortedKeys


class Journal:
    """Records how to undo each mutation while a ``decide`` is in progress."""

    __slots__ = ("undo",)

    def __init__(self) -> None:
        self.undo: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def rollback(self) -> None:
        for fn, args in reversed(self.undo):
            fn(*args)
        self.undo.clear()


class Mutable:
    """Base of state records: attribute writes are journalled when a journal is open."""

    __slots__ = ("_journal",)

    def __init__(self, journal: list[Journal | None] | None = None) -> None:
        self._journal: list[Journal | None] = [None] if journal is None else journal

    def put(self, name: str, value: Any) -> None:
        journal = self._journal[0]
        if journal is not None:
            journal.undo.append((setattr, (self, name, getattr(self, name))))
        setattr(self, name, value)


class Journalled:
    """Journalled mutations of the collections a state holds (the base of ``ClusterState``)."""

    def __init__(self) -> None:
        self._journal: list[Journal | None] = [None]

    @property
    def journal_cell(self) -> list[Journal | None]:
        return self._journal

    def _record(self, fn: Callable[..., Any], *args: Any) -> None:
        journal = self._journal[0]
        if journal is not None:
            journal.undo.append((fn, args))

    def put(self, name: str, value: Any) -> None:
        self._record(setattr, self, name, getattr(self, name))
        setattr(self, name, value)

    def dict_set(self, mapping: dict[Any, Any], key: Any, value: Any) -> None:
        if key in mapping:
            self._record(mapping.__setitem__, key, mapping[key])
        else:
            self._record(mapping.pop, key)
        mapping[key] = value

    def child(self, mapping: dict[Any, Any], key: Any, factory: Callable[[], Any]) -> Any:
        """``mapping[key]``, created with ``factory()`` (journalled) when missing."""
        if key not in mapping:
            self.dict_set(mapping, key, factory())
        return mapping[key]

    def dict_pop(self, mapping: dict[Any, Any], key: Any) -> None:
        if key in mapping:
            self._record(mapping.__setitem__, key, mapping.pop(key))

    def dict_add(self, mapping: dict[Any, int], key: Any, delta: int) -> None:
        self.dict_set(mapping, key, mapping.get(key, 0) + delta)

    def set_add(self, items: set[Any], item: Any) -> None:
        if item not in items:
            self._record(items.discard, item)
            items.add(item)

    def set_discard(self, items: set[Any], item: Any) -> None:
        if item in items:
            self._record(items.add, item)
            items.discard(item)

    def sorted_add(self, items: SortedKeys, item: Any) -> None:
        self._record(items.discard, item)
        items.add(item)

    def sorted_discard(self, items: SortedKeys, item: Any) -> None:
        if items.discard(item):
            self._record(items.add, item)

    def list_insort(self, items: list[Any], item: Any) -> None:
        """Insert into a plain sorted list (small ones, where ``SortedKeys`` costs more than it saves)."""
        self._record(items.remove, item)
        insort(items, item)

    def list_discard(self, items: list[Any], item: Any) -> None:
        index = bisect_left(items, item)
        if index < len(items) and items[index] == item:
            del items[index]
            self._record(insort, items, item)
