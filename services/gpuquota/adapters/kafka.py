"""Kafka plumbing shared by the distributed services: topic names, topic creation, record codecs.

Topic names come from the catalogue (``gpuquota.wire.topics``), optionally behind a prefix
(``GPUQUOTA_TOPIC_PREFIX``), so several deployments, or several tests, can share one cluster. The
prefix also prefixes the consumer group ids derived here.

Records: the value is the message's JSON (``model_dump_json``), the key the UTF-8 string the
catalogue names (pool, job id, node id). Headers carry ``type`` and ``schema_version`` so routers and
filters need not parse JSON; job-state records also carry ``job_queue`` and ``quota_share``.

Credentials: every client the services create (admin, producers, consumers; faust's through
``scheduler.faust_app.faust_credentials``) takes :func:`client_options` of the deployment's
``KafkaSecurity`` (``GPUQUOTA_KAFKA_SECURITY_PROTOCOL`` and the SASL/TLS settings), so no client is
left talking plaintext to a broker that wants TLS or SCRAM.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context

from gpuquota.adapters.partitioner import default_partition
from gpuquota.config.kafka import PLAINTEXT, KafkaSecurity
from gpuquota.wire.base import Message
from gpuquota.wire.inputs import SchedulerInput
from gpuquota.wire.topics import (
    DEAD_LETTER,
    INPUT_RESULTS,
    JOB_STATE,
    NODE_COMMANDS,
    SCHEDULER_INPUTS,
    Topic,
)

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]

_TOPIC_ALREADY_EXISTS = 36
_TOPIC_AUTHORIZATION_FAILED = 29


class _Prefixed:
    """A catalogue topic's name behind the deployment's prefix, as an attribute of ``KafkaTopics``."""

    def __init__(self, topic: Topic) -> None:
        self.topic = topic

    def __get__(self, topics: KafkaTopics, owner: type[KafkaTopics]) -> str:
        return topics.prefix + self.topic.name


@dataclass(frozen=True, slots=True)
class KafkaTopics:
    """The topic names (and group ids) of one deployment: the catalogue's names behind ``prefix``."""

    prefix: str = ""

    inputs = _Prefixed(SCHEDULER_INPUTS)
    job_state = _Prefixed(JOB_STATE)
    input_results = _Prefixed(INPUT_RESULTS)
    node_commands = _Prefixed(NODE_COMMANDS)
    dead_letter = _Prefixed(DEAD_LETTER)

    @property
    def scheduler_group(self) -> str:
        """The scheduler's consumer group (the faust app id)."""
        return self.prefix + "gpuquota-scheduler"

    def node_group(self, node_id: str) -> str:
        """The consumer group of one node agent (it commits its node-command offsets there)."""
        return f"{self.prefix}gpuquota-node-{node_id}"

    def catalogue(self) -> list[tuple[str, Topic]]:
        return [
            (self.inputs, SCHEDULER_INPUTS),
            (self.job_state, JOB_STATE),
            (self.input_results, INPUT_RESULTS),
            (self.node_commands, NODE_COMMANDS),
            (self.dead_letter, DEAD_LETTER),
        ]


def bootstrap_list(servers: str) -> list[str]:
    return [server.strip() for server in servers.split(",") if server.strip()]


def client_options(security: KafkaSecurity) -> dict[str, Any]:
    """aiokafka's keyword arguments for ``security``: protocol, SASL user and password, TLS context."""
    options: dict[str, Any] = {"security_protocol": security.protocol}
    if security.tls:
        options["ssl_context"] = ssl_context(security)
    if security.sasl:
        assert security.password is not None, "the settings require a password with SASL"
        options["sasl_mechanism"] = security.sasl_mechanism
        options["sasl_plain_username"] = security.username
        options["sasl_plain_password"] = security.password.get_secret_value()
    return options


def ssl_context(security: KafkaSecurity) -> ssl.SSLContext:
    """A client TLS context that verifies the broker's certificate and host name (aiokafka's helper)."""
    context: ssl.SSLContext = create_ssl_context(
        cafile=security.cafile, certfile=security.certfile, keyfile=security.keyfile
    )
    return context


async def ensure_topics(
    bootstrap: str, topics: KafkaTopics, partitions: int | None = None, *, security: KafkaSecurity = PLAINTEXT
) -> None:
    """Create the deployment's topics as the catalogue describes them; existing ones are kept.

    ``partitions`` overrides the catalogue's partition count (not the dead-letter topic's). A topic
    this client may not create (Kafka ACLs: the broker refuses even when it exists) is left to the
    operator, who creates the topics beforehand (docs/operations.md), and not waited for.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_list(bootstrap), **client_options(security))
    await admin.start()
    try:
        new = [
            NewTopic(
                name,
                spec.partitions if partitions is None or spec is DEAD_LETTER else partitions,
                1,
                topic_configs=spec.config(),
            )
            for name, spec in topics.catalogue()
        ]
        response = await admin.create_topics(new)
        ours: list[str] = []
        for topic_error in response.topic_errors:
            name, code = topic_error[0], topic_error[1]
            if code == _TOPIC_AUTHORIZATION_FAILED:
                log.info("Kafka topic %s: no permission to create it; it must exist already", name)
            elif code not in (0, _TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create Kafka topic {name}: error {code} {topic_error[2:]}")
            else:
                ours.append(name)
        await _wait_for_leaders(admin, ours)
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, names: list[str], timeout: float = 30.0) -> None:
    """Wait until the broker's metadata shows every partition of ``names`` with a leader.

    A new topic's partitions appear in metadata a moment after CreateTopics returns; a consumer that
    subscribes in between is assigned only the partitions it saw, and would ignore the others until
    its next metadata refresh (minutes).
    """
    deadline = time.monotonic() + timeout
    while True:
        described = await admin.describe_topics(names)
        ready = {
            t["topic"]
            for t in described
            if t["error_code"] == 0 and t["partitions"] and all(p["leader"] >= 0 for p in t["partitions"])
        }
        if ready >= set(names):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kafka topics without leaders after {timeout:g} s: {set(names) - ready}")
        await asyncio.sleep(0.1)  # polling interval while the controller elects leaders


def partition_for(key: str, partitions: int) -> int:
    """The partition the default (Java-compatible murmur2) partitioner picks for ``key``."""
    return default_partition(key.encode(), partitions)


def message_headers(message: Message) -> Headers:
    return [
        ("type", str(getattr(message, "type", "")).encode()),
        ("schema_version", str(message.schema_version).encode()),
    ]


def encode(message: Message) -> bytes:
    return message.model_dump_json().encode()


def header(headers: Sequence[tuple[str, bytes]] | None, name: str) -> str | None:
    for key, value in headers or ():
        if key == name:
            return value.decode("utf-8", errors="replace")
    return None


class InputProducer:
    """Produces scheduler inputs to the inputs topic, keyed by pool, and waits for the broker's ack.

    Idempotent producer (``acks=all``): a retried send is not duplicated in the log, and records of
    one pool keep their order.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: KafkaTopics,
        *,
        client_id: str = "gpuquota",
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self.topics = topics
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_list(bootstrap),
            client_id=client_id,
            enable_idempotence=True,
            linger_ms=1,
            **client_options(security),
        )
        self._unacked: dict[int, float] = {}
        """``send_within``'s records awaiting the broker's acknowledgement: when each was handed over
        (in that order: the first is the oldest)."""
        self._handed = itertools.count()

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def partitions_for(self, topic: str) -> list[int]:
        """The partitions of ``topic`` (waits for its metadata)."""
        return sorted(await self._producer.partitions_for(topic))

    async def send(self, pool: str, message: SchedulerInput) -> None:
        await self._producer.send_and_wait(
            self.topics.inputs, encode(message), key=pool.encode(), headers=message_headers(message)
        )

    async def send_within(self, pool: str, message: SchedulerInput, deadline: float) -> None:
        """``send``, acknowledged within ``deadline`` seconds or ``BrokerUnavailable``.

        The idempotent producer retries an unacknowledged record until the broker takes it, with no
        end, so a record handed over (``sent``) may still reach the log after the deadline. While a
        record has waited longer than ``deadline`` the broker is taken as gone and new records are
        refused without being handed over (``sent`` false): the outage costs each caller nothing but
        the error, and ends when the waiting records are acknowledged.
        """
        if (stuck := self.unavailable(deadline)) is not None:
            raise BrokerUnavailable(stuck, sent=False)
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline):  # waiting for metadata: nothing handed over yet
                delivery = await self._producer.send(
                    self.topics.inputs, encode(message), key=pool.encode(), headers=message_headers(message)
                )
        except TimeoutError:
            raise BrokerUnavailable(f"no partition metadata within {deadline:g} s", sent=False) from None
        except KafkaError as exc:
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}", sent=False) from None
        key = next(self._handed)
        self._unacked[key] = started
        delivery.add_done_callback(lambda _: self._unacked.pop(key, None))
        try:
            await asyncio.wait_for(asyncio.shield(delivery), deadline - (time.monotonic() - started))
        except TimeoutError:
            raise BrokerUnavailable(f"no acknowledgement within {deadline:g} s", sent=True) from None
        except KafkaError as exc:  # not retriable: the broker refused the record
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}", sent=False) from None

    def unavailable(self, deadline: float) -> str | None:
        """Why the broker is taken as gone (a record unacknowledged longer than ``deadline``), or None."""
        oldest = next(iter(self._unacked.values()), None)
        if oldest is None or (waited := time.monotonic() - oldest) <= deadline:
            return None
        return f"{len(self._unacked)} records unacknowledged by the broker, the oldest for {waited:.0f} s"


class BrokerUnavailable(Exception):
    """The broker did not take a record in time; ``sent``: it may still reach the log later."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.sent = sent
