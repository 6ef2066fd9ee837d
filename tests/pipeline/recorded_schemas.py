"""Reading back what a run left on its topics (issue #18): every record validates against the schema
the topic catalogue names for it (``schemas/topics.json``) and its ``type`` header matches its value;
every input has an answer on the input-results topic."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from jsonschema import Draft202012Validator

from gpuquota.adapters.event_store import EventStore
from gpuquota.adapters.kafka import KafkaTopics, header
from gpuquota.wire.input_results import InputResult

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


async def read_all(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` up to its current end, partition after partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    metadata = AIOKafkaProducer(bootstrap_servers=bootstrap)  # its partitions_for waits for metadata
    await consumer.start()
    await metadata.start()
    found: list[ConsumerRecord[bytes, bytes]] = []
    try:
        parts = [TopicPartition(topic, p) for p in sorted(await metadata.partitions_for(topic))]
        ends = await consumer.end_offsets(parts)
        consumer.assign(parts)
        for part in parts:
            await consumer.seek_to_beginning(part)
        remaining = {tp: end for tp, end in ends.items() if end > 0}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, records in batch.items():
                found.extend(r for r in records if r.offset < remaining[tp])
                if records and records[-1].offset + 1 >= remaining[tp]:
                    del remaining[tp]
    finally:
        await metadata.stop()
        await consumer.stop()
    return found


async def check_recorded_messages(bootstrap: str, topics: KafkaTopics) -> Counter[str]:
    """Fail on a record of the deployment's topics that its schema refuses; return the number of
    records per message type (for the caller to check the run covered what it expects)."""
    catalogue = {
        entry["name"]: entry for entry in json.loads((SCHEMAS / "topics.json").read_text())["topics"]
    }
    seen: Counter[str] = Counter()
    for name, topic in topics.catalogue():
        entry = catalogue[topic.name]
        schema = Draft202012Validator(json.loads((SCHEMAS / entry["schema"]).read_text(encoding="utf-8")))
        for record in await read_all(bootstrap, name):
            value = json.loads(record.value or b"")
            errors = [e.message for e in schema.iter_errors(value)]
            assert not errors, f"{name} {record.partition}@{record.offset}: {errors[:3]} in {value}"
            assert value["type"] in entry["messages"], (name, value["type"])
            assert header(record.headers, "type") == value["type"], (name, record.headers)
            seen[value["type"]] += 1
    return seen


async def assert_every_input_answered(
    bootstrap: str, topics: KafkaTopics, store: EventStore, pool: str
) -> int:
    """Every input recorded in the pool's log has an answer; an answer published again (after a
    crash) is the same answer with the same event id. Returns how many answers were repeated."""
    answers: dict[str, InputResult] = {}
    repeated = 0
    for record in await read_all(bootstrap, topics.input_results):
        result = InputResult.model_validate_json(record.value or b"")
        if result.pool != pool:
            continue
        first = answers.setdefault(result.input_event_id, result)
        if first is not result:
            repeated += 1
            assert first.model_dump(exclude={"occurred_at"}) == result.model_dump(exclude={"occurred_at"})
    recorded: list[str] = []
    while batch := await store.read(pool, after_seq=len(recorded)):
        recorded.extend(r.input.event_id for r in batch)
    expected = {i for i in recorded if not i.startswith("tick/")}
    missing = expected - answers.keys()
    assert not missing, f"{len(missing)} inputs without an answer, e.g. {sorted(missing)[:5]}"
    return repeated
