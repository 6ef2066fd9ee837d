"""The node agent's Kafka transport (distributed mode).

Inputs (RegisterNode, heartbeats, AttemptReports, DrainNode, DeregisterNode) go to
``gpuquota.scheduler.inputs`` keyed by the node's pool, through an idempotent producer that waits
for the broker's ack: the agent's outbox retries a send that fails.

Commands come from ``gpuquota.node-commands``, keyed by node id. The link reads only the partition
its node id hashes to (the producers' default murmur2 partitioner) and keeps the records whose key is
its node id. Offsets are committed to the node's own group (``<prefix>gpuquota-node-<node id>``) after
each delivered batch, so a restarted agent resumes where it stopped; a node that never ran starts at
the end of the partition. ``start()`` resolves that position *before* the agent registers, so no
command for the node can be produced before the link reads from a fixed offset. Commands that do not
decode go to the dead-letter topic. Duplicates (the scheduler republishes after a restart) are
harmless: the agent ignores a RunAttempt it already ran and a StopAttempt for an attempt it does not
run, and registering again (``RegisterAgain``) twice only repeats a registration the scheduler takes
idempotently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from gpuquota.adapters.kafka import (
    InputProducer,
    KafkaTopics,
    bootstrap_list,
    client_options,
    encode,
    message_headers,
    partition_for,
)
from gpuquota.config.kafka import PLAINTEXT, KafkaSecurity
from gpuquota.wire.dead_letters import DeadLetter
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.node_commands import NODE_COMMAND_ADAPTER, NodeCommand

log = logging.getLogger(__name__)

Deliver = Callable[[NodeCommand], Awaitable[None]]


class KafkaNodeLink:
    """``send`` for a ``NodeAgent`` and a command feed for its ``deliver``."""

    def __init__(
        self,
        bootstrap: str,
        topics: KafkaTopics,
        node_id: str,
        pool: str,
        *,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.node_id = node_id
        self.pool = pool
        client_id = f"gpuquota-node-{node_id}"
        self.producer = InputProducer(bootstrap, topics, client_id=client_id, security=security)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_list(bootstrap),
            group_id=topics.node_group(node_id),
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            **client_options(security),
        )
        self._letters = AIOKafkaProducer(
            bootstrap_servers=bootstrap_list(bootstrap), acks="all", **client_options(security)
        )
        self._tp: TopicPartition | None = None
        self.delivered = 0

    async def start(self) -> None:
        await self.producer.start()
        await self._letters.start()
        await self._consumer.start()
        count = len(await self._letters.partitions_for(self.topics.node_commands))
        self._tp = TopicPartition(self.topics.node_commands, partition_for(self.node_id, count))
        self._consumer.assign([self._tp])
        position = await self._consumer.position(self._tp)
        log.info("node %s reads %s from offset %d", self.node_id, self._tp, position)

    async def send(self, message: SchedulerInput) -> None:
        await self.producer.send(self.pool, message)

    async def run(self, deliver: Deliver) -> None:
        """Deliver this node's commands, in order, until cancelled."""
        assert self._tp is not None, "start() first"
        key = self.node_id.encode()
        while True:
            batch = await self._consumer.getmany(self._tp, timeout_ms=1000)
            records = batch.get(self._tp, [])
            for record in records:
                if record.key == key:
                    await self._deliver(record, deliver)
            if records:
                try:
                    await self._consumer.commit({self._tp: records[-1].offset + 1})
                except KafkaError as exc:  # e.g. the broker restarts; the next batch commits again
                    log.warning("node %s: committing the command offset failed: %s", self.node_id, exc)

    async def _deliver(self, record: ConsumerRecord[bytes, bytes], deliver: Deliver) -> None:
        try:
            command = NODE_COMMAND_ADAPTER.validate_json(record.value or b"")
        except ValidationError as exc:
            letter = DeadLetter.of(
                record.value or b"",
                reason=f"node command: {exc.errors(include_url=False)[0]['msg']}",
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                occurred_at=time.time_ns() // 1_000_000,
            )
            try:
                await self._letters.send_and_wait(
                    self.topics.dead_letter, encode(letter), key=record.key, headers=message_headers(letter)
                )
            except KafkaError as exc:
                log.error("node %s: dead letter for offset %d lost: %s", self.node_id, record.offset, exc)
            return
        await deliver(command)
        self.delivered += 1

    async def stop(self) -> None:
        await self._consumer.stop()
        await self._letters.stop()
        await self.producer.stop()
