"""Every record a run left on its topics validates against the schema the topic catalogue names for it
(``schemas/topics.json``), and its ``type`` header matches its value (issue #18)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from jsonschema import Draft202012Validator

from gpuquota.adapters.kafka import KafkaTopics, header

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / name).read_text(encoding="utf-8")))


async def check_recorded_messages(bootstrap: str, topics: KafkaTopics) -> Counter[str]:
    """Read every topic of the deployment to its end; fail on a record its schema refuses. Returns the
    number of records per message type (for the caller to check the run covered what it expects)."""
    catalogue = {entry["name"]: entry for entry in json.loads((SCHEMAS / "topics.json").read_text())["topics"]}
    seen: Counter[str] = Counter()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    metadata = AIOKafkaProducer(bootstrap_servers=bootstrap)  # its partitions_for waits for metadata
    await consumer.start()
    await metadata.start()
    try:
        for name, topic in topics.catalogue():
            entry = catalogue[topic.name]
            schema = validator(entry["schema"])
            parts = [TopicPartition(name, p) for p in sorted(await metadata.partitions_for(name))]
            ends = await consumer.end_offsets(parts)
            consumer.assign(parts)
            for part in parts:
                await consumer.seek_to_beginning(part)
            remaining = {tp: end for tp, end in ends.items() if end > 0}
            while remaining:
                batch = await consumer.getmany(*remaining, timeout_ms=1000)
                for tp, records in batch.items():
                    for record in records:
                        value = json.loads(record.value or b"")
                        errors = [e.message for e in schema.iter_errors(value)]
                        assert not errors, f"{name} {tp.partition}@{record.offset}: {errors[:3]} in {value}"
                        assert value["type"] in entry["messages"], (name, value["type"])
                        assert header(record.headers, "type") == value["type"], (name, record.headers)
                        seen[value["type"]] += 1
                        if record.offset + 1 >= remaining[tp]:
                            del remaining[tp]
    finally:
        await metadata.stop()
        await consumer.stop()
    return seen
