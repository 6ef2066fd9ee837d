"""An embedded stack in a background thread (its own event loop), driven through unmodified boto3.

Tests play the node agent themselves: ``stack.register_node`` and ``stack.report`` feed inputs to the
shell in the stack's loop (no local agents, no tick task, so nothing happens behind a test's back).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import boto3
import pytest

from gpuquota.embedded import EmbeddedStack
from gpuquota.scheduler.shell import SchedulerShell
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer

T = TypeVar("T")
G5 = "ml.g5.xlarge"


class StackThread:
    def __init__(self, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="embedded-stack", daemon=True)
        self.thread.start()
        options = {
            "data_dir": None,
            "port": 0,
            "nodes": "",
            "runtime": "simulated",
            "tick_seconds": 0,
            **options,
        }
        self.stack = EmbeddedStack(**options)
        self.run(self.stack.start())
        self.client = boto3.client(
            "batch",
            endpoint_url=self.stack.url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="y",
        )

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def shell(self) -> SchedulerShell:
        assert self.stack.shell is not None
        return self.stack.shell

    def feed(self, kind: type[Any], **fields: Any) -> list[Any]:
        async def go() -> list[Any]:
            return await self.shell.handle(self.shell.make(kind, **fields))

        return self.run(go())

    def register_node(self, node_id: str = "node-1", unit: str = G5, count: int = 3) -> None:
        slots = tuple(SlotOffer(unit=unit, gpus=(i,)) for i in range(count))
        self.feed(inp.RegisterNode, node_id=node_id, pool="default", slots=slots)

    def report(self, job_id: str, status: str, **fields: Any) -> None:
        record = self.shell.state.jobs[job_id]
        assert record.attempt_id is not None, f"{job_id} has no attempt"
        for node_id in sorted({p.node_id for p in record.placements}):
            self.feed(
                inp.AttemptReport,
                node_id=node_id,
                job_id=job_id,
                attempt_id=record.attempt_id,
                status=status,
                **fields,
            )

    def close(self) -> None:
        self.run(self.stack.stop())
        self.client.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def stack() -> Iterator[StackThread]:
    s = StackThread()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def batch(stack: StackThread) -> Any:
    return stack.client


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy (or fail after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
