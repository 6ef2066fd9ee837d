"""``SortedKeys`` behaves like a sorted list of unique keys, across chunk splits and removals."""

from __future__ import annotations

import itertools
import random

import pytest

from gpuquota.core import sortedkeys
from gpuquota.core.sortedkeys import SortedKeys


@pytest.mark.parametrize("seed", range(60))
def test_matches_a_sorted_list(seed: int) -> None:
    """60 seeded random runs of up to 4,000 (add?, key) operations, enough to split chunks of ``LOAD``
    keys many times. Plain seeds, not Hypothesis: a thread left by an earlier test of the suite touches
    the global ``random`` state, which Hypothesis watches while it draws and then reports as flaky."""
    rng = random.Random(seed)
    ops = [(rng.random() < 0.6, rng.randint(0, 3000)) for _ in range(rng.randint(0, 4000))]
    probe, start = rng.randint(0, 3000), rng.randint(0, 40)
    keys, model = SortedKeys(), set[int]()
    for adding, key in ops:
        if adding:
            if key not in model:
                keys.add(key)
                model.add(key)
        else:
            assert keys.discard(key) is (key in model)
            model.discard(key)
    expected = sorted(model)
    assert list(keys) == expected and len(keys) == len(expected) and bool(keys) is bool(expected)
    assert list(keys.islice(start, start + 64)) == expected[start : start + 64]
    assert list(keys.until(probe)) == [k for k in expected if k <= probe]
    if expected:
        assert keys.first() == expected[0]
        assert keys.index(expected[-1]) == len(expected) - 1
    if probe not in model:
        with pytest.raises(ValueError):
            keys.index(probe)


def test_chunks_split_and_stay_bounded() -> None:
    keys = SortedKeys()
    for key in itertools.chain(range(0, 10_000, 2), range(1, 10_000, 2)):
        keys.add(key)
    assert list(keys) == list(range(10_000))
    assert all(len(chunk) <= 2 * sortedkeys.LOAD for chunk in keys._chunks)
    assert list(keys.islice(5_000, 5_003)) == [5_000, 5_001, 5_002]
