"""aiokafka produce/consume round trip against a real broker."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

pytestmark = pytest.mark.integration


async def test_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    topic = f"it-roundtrip-{uuid.uuid4().hex}"
    sent = [(f"k{i}".encode(), f"value-{i}".encode()) for i in range(5)]

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for key, value in sent:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"it-roundtrip-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        received: list[tuple[bytes | None, bytes | None, int]] = []
        async with asyncio.timeout(30):
            while len(received) < len(sent):
                msg = await consumer.getone()
                received.append((msg.key, msg.value, msg.offset))
    finally:
        await consumer.stop()

    assert [(k, v) for k, v, _ in received] == sent
    assert [offset for *_, offset in received] == list(range(len(sent)))
