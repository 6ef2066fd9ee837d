"""``SortedKeys``: a sorted collection of unique keys for queues of up to millions of jobs.

Theory of operation
-------------------
The keys live in a list of sorted *chunks* of at most ``2 * LOAD`` keys, with ``maxes[i]`` the last
key of chunk ``i`` (the layout of ``sortedcontainers.SortedList``, trimmed to what the core uses).
Adding or removing a key bisects ``maxes`` to find its chunk, then bisects and edits that one chunk:
O(log n) comparisons and a memory move of at most ``2 * LOAD`` pointers, whatever the length. A
chunk that grows past ``2 * LOAD`` is split in two; an empty one is dropped.

It lives in the core so that the compiled core (``gpuquota.native.loader``) compiles it too: the share
queues' inserts and removals are on the scheduler's hottest path.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from typing import Any

LOAD = 512


class SortedKeys:
    __slots__ = ("_chunks", "_len", "_maxes")

    def __init__(self) -> None:
        self._chunks: list[list[Any]] = []
        self._maxes: list[Any] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Any]:
        for chunk in self._chunks:
            yield from chunk

    def __repr__(self) -> str:
        return f"SortedKeys({list(self)!r})"

    def first(self) -> Any:
        """The smallest key (``IndexError`` when empty)."""
        return self._chunks[0][0]

    def add(self, key: Any) -> None:
        maxes, chunks = self._maxes, self._chunks
        self._len += 1
        if not maxes:
            chunks.append([key])
            maxes.append(key)
            return
        index = bisect_right(maxes, key)
        if index == len(maxes):
            index -= 1
            chunk = chunks[index]
            chunk.append(key)
            maxes[index] = key
        else:
            chunk = chunks[index]
            insort(chunk, key)
        if len(chunk) > 2 * LOAD:
            chunks.insert(index + 1, chunk[LOAD:])
            del chunk[LOAD:]
            maxes.insert(index, chunk[-1])

    def discard(self, key: Any) -> bool:
        """Remove ``key``; whether it was there."""
        maxes = self._maxes
        index = bisect_left(maxes, key)
        if index == len(maxes):
            return False
        chunk = self._chunks[index]
        position = bisect_left(chunk, key)
        if chunk[position] != key:
            return False
        del chunk[position]
        self._len -= 1
        if not chunk:
            del self._chunks[index]
            del maxes[index]
        elif position == len(chunk):
            maxes[index] = chunk[-1]
        return True

    def index(self, key: Any) -> int:
        """The 0-based position of ``key`` (``ValueError`` when absent)."""
        index = bisect_left(self._maxes, key)
        if index < len(self._maxes):
            chunk = self._chunks[index]
            position = bisect_left(chunk, key)
            if chunk[position] == key:
                return sum(len(c) for c in self._chunks[:index]) + position
        raise ValueError(f"{key!r} is not in the collection")

    def islice(self, start: int, stop: int) -> Iterator[Any]:
        """The keys at positions ``start`` to ``stop - 1``."""
        position = 0
        for chunk in self._chunks:
            if position >= stop:
                return
            end = position + len(chunk)
            if end > start:
                yield from chunk[max(0, start - position) : stop - position]
            position = end

    def until(self, maximum: Any) -> Iterator[Any]:
        """The keys up to ``maximum`` included, smallest first."""
        for chunk in self._chunks:
            if chunk[0] > maximum:
                return
            if chunk[-1] <= maximum:
                yield from chunk
            else:
                yield from chunk[: bisect_right(chunk, maximum)]
                return
