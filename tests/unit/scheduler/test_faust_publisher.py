"""``FaustPublisher`` picks partitions itself (one record batch per partition): they must be the ones
aiokafka's default partitioner, and so the node agents (``partition_for``), pick for the same keys."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from gpuquota.adapters.kafka import partition_for
from gpuquota.adapters.partitioner import default_partition, murmur2


def test_partitions_are_the_default_partitioners() -> None:
    default = DefaultPartitioner()
    for count in (1, 3, 8, 12):
        partitions = list(range(count))
        for index in range(500):
            key = f"bench-1234abcd-job-{index}"
            expected = default(key.encode(), partitions, partitions)
            assert default_partition(key.encode(), count) == expected == partition_for(key, count)


def test_murmur2_is_aiokafkas_for_every_length_and_byte() -> None:
    chance = random.Random(19)
    for length in range(70):
        for _ in range(50):
            data = chance.randbytes(length)
            assert murmur2(data) == aiokafka_murmur2(data), data
    assert murmur2(bytes(range(256)) * 3) == aiokafka_murmur2(bytes(range(256)) * 3)
