"""Kafka with SASL/SCRAM: the project's launcher in SCRAM mode, and gpuquota's clients and services on it.

The module starts its own broker (``deploy/local/kafka.sh start`` with ``KAFKA_SASL=scram``, its own
run directory and free ports, so it never meets the suite's plaintext broker) and reads the client
variables the launcher writes (``client.env``: the user and a password *file*, as a Kubernetes secret
would be mounted). Against it:

* a client built from the settings (``KafkaClientSettings`` -> ``client_options``) creates the
  deployment's topics, produces and consumes;
* a wrong password fails at once with SASL's authentication error, in a client and in a real
  ``gpuquota gateway``, and neither password appears in the error or the logs;
* ``gpuquota scheduler``, ``gpuquota gateway`` and ``gpuquota node-agent`` (faust, aiokafka and the
  node link all authenticating) run a job submitted through boto3 to success.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from gpuquota.adapters.kafka import KafkaTopics, client_options, ensure_topics
from gpuquota.settings import KafkaClientSettings
from tests.conftest import LauncherError, LocalService, unavailable
from tests.gateway.helpers import payload, status, submit, worked_example
from tests.pipeline.conftest import wait_until
from tests.pipeline.services import ServiceProcess, Services, batch_client, free_port

pytestmark = pytest.mark.integration

REFUSED_WITHIN = 10.0
"""Seconds a client or service with a wrong password may take to fail (it must not retry for long)."""


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


@pytest.fixture(scope="module")
def sasl_env() -> Iterator[dict[str, str]]:
    """The ``GPUQUOTA_*`` variables of a client of a fresh SCRAM-SHA-512 broker (a module's own)."""
    service = LocalService("kafka.sh", "KAFKA_RUN_DIR", "bootstrap")
    service.env["KAFKA_SASL"] = "scram"
    for inherited in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "KAFKA_SASL_PASSWORD"):
        service.env.pop(inherited, None)  # free ports and a random password: never the suite's
    try:
        service.start()
    except (LauncherError, OSError) as exc:
        service.stop()
        unavailable("SASL Kafka broker", "KAFKA_RUN_DIR", f"kafka.sh start --sasl failed: {exc}")
    try:
        yield read_env_file(service.run_dir / "client.env")
    finally:
        service.stop()


@pytest.fixture(scope="module")
def password(sasl_env: dict[str, str]) -> str:
    return Path(sasl_env["GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()


def test_launcher_writes_a_scram_client_configuration(sasl_env: dict[str, str], password: str) -> None:
    assert sasl_env["GPUQUOTA_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    assert sasl_env["GPUQUOTA_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert sasl_env["GPUQUOTA_KAFKA_SASL_USERNAME"] == "admin"
    assert len(password) >= 16
    secret = Path(sasl_env["GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"])
    assert secret.stat().st_mode & 0o077 == 0, "the password file is readable by others"


async def test_client_from_the_settings_produces_and_consumes(sasl_env: dict[str, str]) -> None:
    settings = KafkaClientSettings.from_env(sasl_env)
    security = settings.kafka_security
    topics = KafkaTopics(f"sasl-{uuid.uuid4().hex[:8]}.")
    await ensure_topics(settings.kafka, topics, partitions=1, security=security)  # the admin client

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka, **client_options(security))
    await producer.start()
    try:
        sent = [f"record-{i}".encode() for i in range(3)]
        for value in sent:
            await producer.send_and_wait(topics.inputs, value, key=b"pool")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topics.inputs,
        bootstrap_servers=settings.kafka,
        group_id=f"{topics.prefix}reader",
        auto_offset_reset="earliest",
        **client_options(security),
    )
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(20):
            while len(got) < len(sent):
                batch = await consumer.getmany(timeout_ms=500)
                got += [record.value or b"" for records in batch.values() for record in records]
    finally:
        await consumer.stop()
    assert got == sent


async def test_wrong_password_fails_promptly_and_is_never_shown(
    sasl_env: dict[str, str], password: str, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    env = {k: v for k, v in sasl_env.items() if k != "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"}
    settings = KafkaClientSettings.from_env({**env, "GPUQUOTA_KAFKA_SASL_PASSWORD": wrong})
    security = settings.kafka_security
    assert wrong not in repr(security) and wrong not in repr(settings)

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka, **client_options(security))
    started = time.monotonic()
    caplog.set_level(logging.DEBUG)
    with pytest.raises(KafkaConnectionError) as refused:
        await producer.start()
    await producer.stop()
    assert time.monotonic() - started < REFUSED_WITHIN
    assert "SaslAuthenticationFailed" in caplog.text and "invalid credentials" in caplog.text
    for secret in (wrong, password):
        assert secret not in caplog.text and secret not in str(refused.value)


async def test_gateway_with_a_wrong_password_exits_at_once(
    sasl_env: dict[str, str], password: str, database_url: str, tmp_path: Path
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    secret = tmp_path / "kafka-password"
    secret.write_text(wrong + "\n")
    env = {
        **sasl_env,
        "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE": str(secret),
        "GPUQUOTA_DATABASE_URL": database_url,
        "GPUQUOTA_PORT": str(free_port()),
        "GPUQUOTA_LOG_LEVEL": "DEBUG",
    }
    gateway = ServiceProcess("gateway", env, tmp_path / "gateway.log")
    started = time.monotonic()
    with pytest.raises(AssertionError, match="exited early"):
        await gateway.start(timeout=REFUSED_WITHIN * 3)
    assert await gateway.stop() == 3  # EXIT_UNREACHABLE: the broker refused this client
    assert time.monotonic() - started < REFUSED_WITHIN * 3
    log = gateway.tail(100_000)
    assert "SaslAuthenticationFailed" in log, log[-2000:]
    assert wrong not in log and password not in log


async def test_three_services_run_a_job_over_sasl(
    sasl_env: dict[str, str], password: str, database_url: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topics = KafkaTopics(f"sasl-{run}.")
    security = KafkaClientSettings.from_env(sasl_env).kafka_security
    await ensure_topics(sasl_env["GPUQUOTA_KAFKA"], topics, partitions=2, security=security)
    services = Services(sasl_env["GPUQUOTA_KAFKA"], database_url, topics.prefix, f"p-{run}", tmp_path)
    services.common.update(sasl_env)  # the protocol, user and password file: nothing else differs
    port = free_port()
    running = [services.scheduler(), services.gateway(port), services.node_agent(f"node-{run}")]
    try:
        await asyncio.gather(*(service.start() for service in running))
        batch = batch_client(f"http://127.0.0.1:{port}")
        await asyncio.to_thread(worked_example, batch)
        sim = payload(Environment={"GPUQUOTA_SIM_DURATION_SECONDS": "0.2"})
        job_id = await asyncio.to_thread(submit, batch, "train", "QS2", serviceRequestPayload=sim)

        async def succeeded() -> bool:
            return await asyncio.to_thread(status, batch, job_id) == "SUCCEEDED"

        await wait_until(succeeded, 30, "the job to succeed over SASL")
        assert all(service.alive for service in running)
        assert [await service.stop() for service in running] == [0, 0, 0]
        for service in running:
            assert password not in service.tail(10_000_000), f"{service.command} logged the password"
    finally:
        await services.close()
