"""A faust-streaming agent (consume one topic, produce to another) against the real broker.

The worker runs as a subprocess (``faust_echo_app.py worker``): faust wants to own its event loop
and signal handlers, which a pytest-asyncio loop should not share.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

pytestmark = pytest.mark.integration

APP = Path(__file__).with_name("faust_echo_app.py")
DEADLINE_S = 90


async def test_faust_agent_consumes_and_produces(kafka_bootstrap: str, tmp_path: Path) -> None:
    run = uuid.uuid4().hex
    app_id, source, sink = f"it-faust-{run}", f"it-faust-in-{run}", f"it-faust-out-{run}"
    inputs = [f"hello-{i}".encode() for i in range(3)]

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for value in inputs:
            await producer.send_and_wait(source, value, partition=0)
    finally:
        await producer.stop()

    log_path = tmp_path / "worker.log"
    env = {
        **os.environ,
        "ECHO_BOOTSTRAP": kafka_bootstrap,
        "ECHO_APP_ID": app_id,
        "ECHO_IN": source,
        "ECHO_OUT": sink,
        "ECHO_DATADIR": str(tmp_path / "faust-data"),
    }
    with log_path.open("wb") as log:
        worker = await asyncio.create_subprocess_exec(
            sys.executable, str(APP), "worker", "--loglevel", "info",
            env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        received = await _consume_while_alive(worker, kafka_bootstrap, sink, len(inputs))
        assert received == [value.upper() for value in inputs]
        await _wait_for_commit(worker, kafka_bootstrap, app_id, TopicPartition(source, 0), len(inputs))
    except BaseException:
        print(log_path.read_text(errors="replace")[-8000:], file=sys.stderr)
        raise
    finally:
        await _stop(worker)
    assert worker.returncode == 0, log_path.read_text(errors="replace")[-8000:]


async def _consume_while_alive(
    worker: asyncio.subprocess.Process, bootstrap: str, topic: str, count: int
) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        received: list[bytes] = []
        async with asyncio.timeout(DEADLINE_S):
            while len(received) < count:
                assert worker.returncode is None, "faust worker exited early"
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    received.extend(msg.value for msg in messages)
        return received
    finally:
        await consumer.stop()


async def _wait_for_commit(
    worker: asyncio.subprocess.Process, bootstrap: str, group: str, tp: TopicPartition, offset: int
) -> None:
    """The app's consumer group commits the source offset past every input."""
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await probe.start()
    try:
        async with asyncio.timeout(30):
            while (await probe.committed(tp)) != offset:
                assert worker.returncode is None, "faust worker exited early"
                await asyncio.sleep(0.2)  # polling interval, not synchronisation
    finally:
        await probe.stop()


async def _stop(worker: asyncio.subprocess.Process) -> None:
    if worker.returncode is not None:
        return
    worker.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(worker.wait(), timeout=30)
    except TimeoutError:
        worker.kill()
        await worker.wait()
