"""``FaustPublisher`` picks partitions itself (one record batch per partition): they must be the ones
aiokafka's default partitioner, and so the node agents (``partition_for``), pick for the same keys."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from gpuquota.adapters.kafka import partition_for
from gpuquota.adapters.partitioner import default_partition


def test_partitions_are_the_default_partitioners() -> None:
    default = DefaultPartitioner()
    for count in (1, 3, 8, 12):
        partitions = list(range(count))
        for index in range(500):
            key = f"bench-1234abcd-job-{index}"
            expected = default(key.encode(), partitions, partitions)
            assert default_partition(key.encode(), count) == expected == partition_for(key, count)
