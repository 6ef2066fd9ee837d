"""Fresh ids: well-formed UUIDs of their version, never repeated, time-ordered input ids,
and no block of random digits shared with a forked child."""

from __future__ import annotations

import os
import uuid

from gpuquota.support import ids


def test_uuid4_is_a_version_4_rfc_uuid_and_never_repeats() -> None:
    drawn = [ids.uuid4() for _ in range(3 * 256 + 7)]  # across several blocks
    for text in drawn:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    assert len(set(drawn)) == len(drawn)


def test_uuid7_carries_the_millisecond_and_sorts_by_it() -> None:
    first, second = ids.uuid7(now_ms=1_764_000_000_000), ids.uuid7(now_ms=1_764_000_000_001)
    for text in (first, second):
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
    assert uuid.UUID(first).int >> 80 == 1_764_000_000_000
    assert first < second  # the index of input ids grows at its end
    same_ms = {ids.uuid7(now_ms=5) for _ in range(1000)}
    assert len(same_ms) == 1000  # 74 random bits within one millisecond


def test_a_forked_child_draws_digits_of_its_own() -> None:
    ids.uuid4()  # the parent holds a block with digits left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, ids.uuid4().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = ids.uuid4()
    assert child != parent
    assert uuid.UUID(child).version == 4
