"""Kafka transactions through aiokafka: consume-transform-produce with offsets in the transaction.

One transaction is committed and one aborted. A read_committed consumer must see the committed
output and never the aborted one, and the group's committed offset must be the one sent in the
committed transaction (the aborted transaction's offset must not stick).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

pytestmark = pytest.mark.integration


async def _read_until(bootstrap: str, topic: str, isolation_level: str, last: bytes) -> list[bytes]:
    """All values of partition 0 of ``topic`` from the start up to and including ``last``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        async with asyncio.timeout(30):
            while last not in values:
                batch = await consumer.getmany(tp, timeout_ms=500)
                values.extend(msg.value for msg in batch.get(tp, []))
        return values
    finally:
        await consumer.stop()


async def test_transaction_commit_and_abort(kafka_bootstrap: str) -> None:
    run = uuid.uuid4().hex
    source, sink, group = f"it-txn-in-{run}", f"it-txn-out-{run}", f"it-txn-group-{run}"
    source_tp = TopicPartition(source, 0)

    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await plain.start()
    try:
        for i in range(2):
            await plain.send_and_wait(source, f"input-{i}".encode(), partition=0)
    finally:
        await plain.stop()

    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    txp = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"it-txn-{run}")
    await consumer.start()
    await txp.start()
    try:
        async with asyncio.timeout(30):
            first = await consumer.getone()
            second = await consumer.getone()
        assert (first.value, second.value) == (b"input-0", b"input-1")

        # committed: output + the consumer position after `first`
        async with txp.transaction():
            await txp.send(sink, b"out-committed", partition=0)
            await txp.send_offsets_to_transaction({source_tp: first.offset + 1}, group)

        # aborted: output + the position after `second` must both be discarded
        await txp.begin_transaction()
        await txp.send(sink, b"out-aborted", partition=0)
        await txp.send_offsets_to_transaction({source_tp: second.offset + 1}, group)
        await txp.abort_transaction()

        # a later committed transaction, so readers have something after the aborted records
        async with txp.transaction():
            await txp.send(sink, b"out-marker", partition=0)

        assert await consumer.committed(source_tp) == first.offset + 1
    finally:
        await txp.stop()
        await consumer.stop()

    committed_view = await _read_until(kafka_bootstrap, sink, "read_committed", b"out-marker")
    assert committed_view == [b"out-committed", b"out-marker"]

    # sanity check that the aborted record really was written (and is only filtered out)
    uncommitted_view = await _read_until(kafka_bootstrap, sink, "read_uncommitted", b"out-marker")
    assert uncommitted_view == [b"out-committed", b"out-aborted", b"out-marker"]

    # a fresh member of the group resumes after `first`: the aborted offset did not stick
    resumed = AIOKafkaConsumer(
        source,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await resumed.start()
    try:
        async with asyncio.timeout(30):
            msg = await resumed.getone()
        assert (msg.offset, msg.value) == (second.offset, b"input-1")
    finally:
        await resumed.stop()
