"""Kafka with SASL/SCRAM: the project's launcher in SCRAM mode, and gpuquota's clients and services on it.

The module starts its own broker (``deploy/local/kafka.sh start`` with ``KAFKA_SASL=scram``, its own
run directory and free ports, so it never meets the suite's plaintext broker), with ACLs enforced and a
user per kind of client, and reads the client variables the launcher writes (``client.env``: the
administrator and a password *file*, as a Kubernetes secret would be mounted). Against it:

* a client built from the settings (``KafkaClientSettings`` -> ``client_options``) creates the
  deployment's topics, produces and consumes;
* a wrong password fails at once with SASL's authentication error, in a client and in a real
  ``gpuquota gateway``, and neither password appears in the error or the logs;
* with docs/operations.md's ACL recipe and PostgreSQL GRANT recipe applied as written,
  ``gpuquota scheduler``, ``gpuquota gateway`` and ``gpuquota node-agent``, each as its own Kafka user
  and the first two as their own database roles, run a job submitted through boto3 to success; an
  ``EventsClient`` as the ``events`` user follows its transitions; the gateway's user may not read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError

from gpuquota.adapters.kafka import KafkaTopics, client_options, ensure_topics
from gpuquota.adapters.postgres_store import PostgresEventStore
from gpuquota.client.events import EventsClient
from gpuquota.config.kafka import KafkaClientSettings
from tests.conftest import LauncherError, LocalService, unavailable
from tests.gateway.helpers import payload, status, submit, worked_example
from tests.pipeline.conftest import wait_until
from tests.pipeline.services import ServiceProcess, Services, batch_client, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ACL_BATCH = Path(__file__).with_name("AclBatch.java")
USERS = ("gateway", "scheduler", "node", "events")
REFUSED_WITHIN = 10.0
"""Seconds a client or service with a wrong password may take to fail (it must not retry for long)."""


def read_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


@dataclass(frozen=True)
class Broker:
    run_dir: Path
    admin_env: dict[str, str]
    """The administrator's client variables (a super user: ACLs do not apply to it)."""

    def user_env(self, user: str) -> dict[str, str]:
        password = self.run_dir / f"sasl-password-{user}"
        return {
            **self.admin_env,
            "GPUQUOTA_KAFKA_SASL_USERNAME": user,
            "GPUQUOTA_KAFKA_SASL_PASSWORD_FILE": str(password),
        }


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """A fresh SCRAM-SHA-512 broker that enforces ACLs, with a user per kind of client (a module's own)."""
    service = LocalService("kafka.sh", "KAFKA_RUN_DIR", "bootstrap")
    service.env.update(KAFKA_SASL="scram", KAFKA_SASL_USERS=" ".join(USERS), KAFKA_ACLS="1")
    for inherited in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "KAFKA_SASL_PASSWORD", "KAFKA_SASL_USER"):
        service.env.pop(inherited, None)  # free ports and a random password: never the suite's
    try:
        service.start()
    except (LauncherError, OSError) as exc:
        service.stop()
        unavailable("SASL Kafka broker", "KAFKA_RUN_DIR", f"kafka.sh start --sasl failed: {exc}")
    try:
        yield Broker(service.run_dir, read_env_file(service.run_dir / "client.env"))
    finally:
        service.stop()


@pytest.fixture(scope="module")
def sasl_env(broker: Broker) -> dict[str, str]:
    return broker.admin_env


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
    assert gateway.proc is not None
    code = await asyncio.wait_for(gateway.proc.wait(), REFUSED_WITHIN)  # its stdout closed: it is ending
    log = gateway.tail(100_000)
    assert code == 3, log[-3000:]  # EXIT_UNREACHABLE: the broker refused this client
    assert time.monotonic() - started < REFUSED_WITHIN * 3
    assert "SaslAuthenticationFailed" in log, log[-2000:]
    assert wrong not in log and password not in log


def recipe(name: str) -> str:
    """The code block between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` in docs/operations.md."""
    page = (ROOT / "docs" / "operations.md").read_text()
    block = page.split(f"<!-- BEGIN {name} -->", 1)[1].split(f"<!-- END {name} -->", 1)[0]
    found = re.search(r"```\w+\n(.*?)```", block, re.DOTALL)
    assert found is not None, f"docs/operations.md: no code block in {name}"
    return found.group(1)


def apply_acl_recipe(broker: Broker, prefix: str, tmp_path: Path) -> int:
    """Run the ACL recipe's bash as written, its ``kafka-acls.sh`` calls collected and run in one JVM."""
    commands = tmp_path / "acl-commands.txt"
    collect = """kafka-acls.sh() { (IFS=$'\\t'; printf '%s\\n' "$*") >>"$ACL_COMMANDS"; }\n"""
    env = {
        "PATH": os.environ["PATH"],
        "KAFKA": broker.admin_env["GPUQUOTA_KAFKA"],
        "P": prefix,
        "ADMIN": str(broker.run_dir / "admin.properties"),
        "ACL_COMMANDS": str(commands),
    }
    script = collect + recipe("ACL RECIPE")
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, check=True, timeout=30)
    jars = subprocess.run(
        ["bash", str(ROOT / "deploy/local/kafka.sh"), "jars"], capture_output=True, text=True, check=True
    ).stdout.strip()
    java = subprocess.run(
        ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
         f"-Dlog4j2.configurationFile={ROOT}/deploy/local/kafka/log4j2.properties",
         f"-Dkafka.logs.dir={tmp_path}", "-cp", f"{jars}/*", str(ACL_BATCH), str(commands)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert java.returncode == 0, (java.stdout + java.stderr)[-4000:]
    return len(commands.read_text().splitlines())


def with_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}").geturl()


@contextlib.asynccontextmanager
async def granted_roles(database_url: str, run: str) -> AsyncIterator[dict[str, str]]:
    """docs/operations.md's GRANT recipe as written (its roles renamed for this run): their URLs."""
    roles = {"gpuquota_scheduler": f"gq_scheduler_{run}", "gpuquota_gateway": f"gq_gateway_{run}"}
    sql = recipe("GRANT RECIPE")
    for documented, own in roles.items():
        sql = sql.replace(documented, own)
    passwords = dict(re.findall(r"CREATE ROLE (\w+) LOGIN PASSWORD '([^']+)'", sql))
    await (await PostgresEventStore.connect(database_url)).close()  # the owner applies the migrations
    owner = await asyncpg.connect(database_url)
    try:
        await owner.execute(sql)
        yield {
            doc.removeprefix("gpuquota_"): with_user(database_url, own, passwords[own])
            for doc, own in roles.items()
        }
    finally:
        for own in roles.values():
            if await owner.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", own):
                await owner.execute(
                    f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {own};"
                    f"REVOKE ALL ON SCHEMA public FROM {own}; DROP ROLE {own}"
                )
        await owner.close()


async def test_services_as_their_own_users_run_a_job(
    broker: Broker, database_url: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topics = KafkaTopics(f"sasl-{run}.")
    kafka, pool = broker.admin_env["GPUQUOTA_KAFKA"], f"p-{run}"
    admin = KafkaClientSettings.from_env(broker.admin_env).kafka_security
    await ensure_topics(kafka, topics, partitions=2, security=admin)  # the operator creates the topics
    assert await asyncio.to_thread(apply_acl_recipe, broker, topics.prefix, tmp_path) == 7

    services = Services(kafka, database_url, topics.prefix, pool, tmp_path)
    port = free_port()
    async with granted_roles(database_url, run) as urls:
        scheduler_env = {**broker.user_env("scheduler"), "GPUQUOTA_DATABASE_URL": urls["scheduler"]}
        gateway_env = {**broker.user_env("gateway"), "GPUQUOTA_DATABASE_URL": urls["gateway"]}
        running = [
            services.scheduler(None, **scheduler_env),
            services.gateway(port, **gateway_env),
            services.node_agent(f"node-{run}", env=broker.user_env("node")),
        ]
        events = KafkaClientSettings.from_env(broker.user_env("events")).kafka_security
        try:
            await asyncio.gather(*(service.start() for service in running))
            async with EventsClient(kafka, pool=pool, topic_prefix=topics.prefix, security=events) as client:
                batch = batch_client(f"http://127.0.0.1:{port}")
                await asyncio.to_thread(worked_example, batch)
                sim = payload(Environment={"GPUQUOTA_SIM_DURATION_SECONDS": "0.2"})
                job_id = await asyncio.to_thread(submit, batch, "train", "QS2", serviceRequestPayload=sim)
                statuses = []
                async with asyncio.timeout(30):
                    async for transition in client.transitions(job_id=job_id):
                        statuses.append(transition.status)
                        if transition.terminal:
                            break
            assert statuses[-1] == "SUCCEEDED", statuses

            async def gateway_shows_success() -> bool:  # its read model follows the log in PostgreSQL
                return await asyncio.to_thread(status, batch, job_id) == "SUCCEEDED"

            await wait_until(gateway_shows_success, 10, "the gateway to show the job succeeded")
            t = topics
            assert await visible_topics(broker.user_env("gateway"), t) == {t.inputs}
            assert await visible_topics(broker.user_env("node"), t) == {
                t.inputs,
                t.node_commands,
                t.dead_letter,
            }
            assert await visible_topics(broker.user_env("events"), t) == {
                t.inputs,
                t.job_state,
                t.input_results,
            }
            assert all(service.alive for service in running)
            assert [await service.stop() for service in running] == [0, 0, 0]
            for service in running:
                log = service.tail(10_000_000)
                for user in USERS:
                    secret = (broker.run_dir / f"sasl-password-{user}").read_text().strip()
                    assert secret not in log, f"{service.command} logged {user}'s password"
        finally:
            await services.close()


async def visible_topics(env: dict[str, str], topics: KafkaTopics) -> set[str]:
    """The deployment's topics this user may describe. Read and Write each imply Describe, so a topic
    it may not describe is one it can neither read nor write (the broker answers error 29)."""
    settings = KafkaClientSettings.from_env(env)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka, **client_options(settings.kafka_security))
    await admin.start()
    try:
        described = await admin.describe_topics([name for name, _ in topics.catalogue()])
    finally:
        await admin.close()
    assert {t["error_code"] for t in described} <= {0, 29}, described
    return {t["topic"] for t in described if t["error_code"] == 0}


async def test_gpuquota_up_distributed_over_sasl(broker: Broker, database_url: str, tmp_path: Path) -> None:
    """``gpuquota up --kafka``: the one-process stack reads the same ``GPUQUOTA_KAFKA_*`` variables."""
    run, port = uuid.uuid4().hex[:8], free_port()
    env = {**broker.admin_env, "GPUQUOTA_TOPIC_PREFIX": f"sasl-up-{run}.", "GPUQUOTA_POOL": f"p-{run}"}
    up = ServiceProcess(
        "up", env, tmp_path / "up.log",
        args=[
            "--kafka", env.pop("GPUQUOTA_KAFKA"), "--database-url", database_url, "--port", str(port),
            "--runtime", "simulated", "--data-dir", str(tmp_path / "data"),
        ],
    )  # fmt: skip
    try:
        await up.start()
        batch = batch_client(f"http://127.0.0.1:{port}")
        await asyncio.to_thread(worked_example, batch)
        sim = payload(Environment={"GPUQUOTA_SIM_DURATION_SECONDS": "0.2"})
        job_id = await asyncio.to_thread(submit, batch, "train", "QS1", serviceRequestPayload=sim)

        async def succeeded() -> bool:
            return await asyncio.to_thread(status, batch, job_id) == "SUCCEEDED"

        await wait_until(succeeded, 30, "the job to succeed under gpuquota up over SASL")
        assert await up.stop() == 0
        password = Path(broker.admin_env["GPUQUOTA_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
        assert password not in up.tail(10_000_000)
    except BaseException:
        print(up.tail())
        raise
    finally:
        await up.kill()
