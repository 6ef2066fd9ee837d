"""The event interface without Python on the platform's side (issue #18): Kafka's own console producer
sends raw JSON lines (docs/events.md) to the real scheduler on the real broker, and Kafka's console
consumer reads the answers and the job's transitions back, headers included."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpuquota.adapters.kafka import KafkaTopics
from gpuquota.scheduler.faust_app import SchedulerService
from tests.builders import Harness
from tests.pipeline.conftest import Producer, scheduler_config, unique

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JVM = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]  # short-lived tools: start fast
READ_SECONDS = 120
"""How long a console consumer may wait for what it expects (each JVM alone takes seconds to start)."""


@pytest.fixture(scope="module")
def kafka_classpath() -> str:
    """The broker's jars, which carry the console tools (``deploy/local/kafka/pom.xml``)."""
    if shutil.which("java") is None:
        pytest.fail("java is needed for Kafka's console tools (the broker needs it too)")
    libs = subprocess.run(
        [str(ROOT / "deploy/local/kafka.sh"), "jars"], check=True, capture_output=True, text=True, timeout=600
    ).stdout.strip()
    return f"{libs}/*"


async def java(classpath: str, tool: str, *args: str, stdin: bytes = b"") -> str:
    proc = await asyncio.create_subprocess_exec(
        "java", *JVM, "-cp", classpath, tool, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), READ_SECONDS + 60)
    assert proc.returncode == 0, f"{tool} exited {proc.returncode}: {err.decode()[-2000:]}"
    return out.decode()


async def console_produce(classpath: str, bootstrap: str, topic: str, lines: Sequence[str]) -> None:
    """``kafka-console-producer.sh``: each line is ``headers<TAB>key<TAB>value``."""
    await java(
        classpath, "org.apache.kafka.tools.ConsoleProducer",
        "--bootstrap-server", bootstrap, "--topic", topic,
        "--property", "parse.headers=true", "--property", "parse.key=true",
        "--producer-property", "acks=all", "--producer-property", "enable.idempotence=true",
        stdin="".join(f"{line}\n" for line in lines).encode(),
    )  # fmt: skip


async def console_consume(classpath: str, bootstrap: str, topic: str, count: int) -> list[dict[str, Any]]:
    """``kafka-console-consumer.sh --from-beginning --max-messages count``: headers, key and value."""
    out = await java(
        classpath, "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server", bootstrap, "--topic", topic, "--from-beginning",
        "--max-messages", str(count), "--timeout-ms", str(READ_SECONDS * 1000),
        "--property", "print.headers=true", "--property", "print.key=true",
    )  # fmt: skip
    records = []
    for line in out.splitlines():
        headers, key, value = line.split("\t", 2)
        pairs = dict(pair.split(":", 1) for pair in headers.split(","))
        records.append({"headers": pairs, "key": key, "value": json.loads(value)})
    assert len(records) == count, out
    return records


def line(key: str, message: dict[str, Any]) -> str:
    headers = f"type:{message['type']},schema_version:1"
    return f"{headers}\t{key}\t{json.dumps(message)}"


def submit_job(event_id: str, job_id: str, share: str) -> dict[str, Any]:
    return {
        "type": "SubmitJob", "schema_version": 1, "event_id": event_id, "occurred_at": 1_764_612_000_000,
        "job": {
            "job_id": job_id, "job_name": "console-job", "job_queue": "jq", "quota_share": share,
            "priority": 10, "unit": "ml.g5.xlarge", "count": 1, "created_at": 1_764_612_000_000,
            "payload": json.dumps({"TrainingJobName": "console-job"}),
        },
    }  # fmt: skip


def report(event_id: str, job_id: str, status: str) -> dict[str, Any]:
    """A node agent's report on the job's first attempt (attempt ids are ``<job id>#<n>``)."""
    return {
        "type": "AttemptReport", "schema_version": 1, "event_id": event_id, "occurred_at": 1_764_612_001_000,
        "node_id": "node-0", "job_id": job_id, "attempt_id": f"{job_id}#1", "status": status,
    }  # fmt: skip


@asynccontextmanager
async def ready_scheduler(
    kafka: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
) -> AsyncIterator[int]:
    """The scheduler, with the worked example's resources and node; yields how many inputs that took."""
    setup = unique(Harness.worked_example().inputs, run_id)
    for message in setup:
        await producer.send(message)
    service = SchedulerService(scheduler_config(kafka, database_url, topics, pool, tmp_path))
    await service.start()
    try:
        yield len(setup)
    finally:
        await service.stop()
    assert service.failure is None, service.failure


async def test_console_producer_submits_and_reprioritises_and_console_consumer_reads_the_outcome(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    kafka_classpath: str,
) -> None:
    job_id = str(uuid.uuid4())
    sent = [
        submit_job(f"{run_id}-submit", job_id, "QS1"),
        {"type": "UpdateJobPriority", "schema_version": 1, "event_id": f"{run_id}-priority",
         "occurred_at": 1_764_612_000_500, "job_id": job_id, "priority": 50},
        report(f"{run_id}-starting", job_id, "STARTING"),
        report(f"{run_id}-running", job_id, "RUNNING"),
        report(f"{run_id}-succeeded", job_id, "SUCCEEDED"),
    ]  # fmt: skip
    async with ready_scheduler(
        kafka_bootstrap, database_url, topics, pool, run_id, tmp_path, producer
    ) as setup:
        await console_produce(kafka_classpath, kafka_bootstrap, topics.inputs, [line(pool, m) for m in sent])
        results, transitions = await asyncio.gather(
            console_consume(kafka_classpath, kafka_bootstrap, topics.input_results, setup + len(sent)),
            console_consume(kafka_classpath, kafka_bootstrap, topics.job_state, 5),
        )

    answers = [r for r in results if r["headers"]["input_event_id"].startswith(f"{run_id}-")]
    assert [a["value"]["input_event_id"] for a in answers] == [m["event_id"] for m in sent]
    assert {a["value"]["outcome"] for a in answers} == {"ACCEPTED"}
    assert all(a["key"] == pool and a["headers"]["type"] == "InputResult" for a in answers)
    assert [e["type"] for e in answers[1]["value"]["events"]] == ["JobPriorityChanged"]

    assert {t["key"] for t in transitions} == {job_id}
    assert [t["value"]["status"] for t in transitions] == [
        "RUNNABLE",
        "SCHEDULED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ]
    causes = [sent[i]["event_id"] for i in (0, 0, 2, 3, 4)]  # the submission dispatched the job itself
    assert [t["headers"]["input_event_id"] for t in transitions] == causes
    assert (
        transitions[0]["headers"]["quota_share"] == "QS1" and transitions[0]["value"]["job"]["priority"] == 10
    )


async def test_console_consumer_reads_why_an_input_was_rejected(
    kafka_bootstrap: str,
    database_url: str,
    topics: KafkaTopics,
    pool: str,
    run_id: str,
    tmp_path: Path,
    producer: Producer,
    kafka_classpath: str,
) -> None:
    refused = submit_job(f"{run_id}-refused", str(uuid.uuid4()), "NOPE")
    async with ready_scheduler(
        kafka_bootstrap, database_url, topics, pool, run_id, tmp_path, producer
    ) as setup:
        await console_produce(kafka_classpath, kafka_bootstrap, topics.inputs, [line(pool, refused)])
        results = await console_consume(kafka_classpath, kafka_bootstrap, topics.input_results, setup + 1)

    answer = results[-1]
    assert answer["headers"]["input_event_id"] == refused["event_id"]
    assert answer["value"]["outcome"] == "REJECTED"
    assert (
        answer["value"]["reason"] == "Quota share NOPE does not exist in job queue jq"
    )  # as the HTTP API says
    assert answer["value"]["job_id"] == refused["job"]["job_id"]
