"""Fixtures for the command-line tests: an embedded stack in a thread and an in-process ``gpuquota``.

The stack is the gateway tests' ``StackThread`` (no local agents, no tick task): tests play the node
agent with ``stack.register_node`` and ``stack.report``, so job states change only when a test says so.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuquota.entrypoints.cli import main
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import status, submit, worked_example


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Cli:
    """Runs ``gpuquota --endpoint URL ARGS`` in this process and captures its output (the global option
    before the subcommand, so a command's ``-- CMD ...`` stays last)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], endpoint: str) -> None:
        self.capsys = capsys
        self.endpoint = endpoint

    def __call__(self, *argv: str, endpoint: bool = True) -> Result:
        self.capsys.readouterr()
        try:
            rc = main(["--endpoint", self.endpoint, *argv] if endpoint else list(argv))
        except SystemExit as exc:  # a usage error (argparse): exit code 2
            rc = exc.code if isinstance(exc.code, int) else 1
        captured = self.capsys.readouterr()
        return Result(rc, captured.out, captured.err)


@pytest.fixture
def stack() -> Iterator[StackThread]:
    s = StackThread()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def cli(stack: StackThread, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys, stack.stack.url)


@pytest.fixture
def closed_port() -> str:
    """The URL of a local port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def play_worked_example(stack: StackThread) -> dict[str, str]:
    """S8 steps 1 and 2 (queue ``jq``), the node reporting every transition: high and qs2_job_1 run,
    med was preempted cross-share and waits, low waits behind it. Returns job name -> id."""
    batch: Any = stack.client
    worked_example(batch)
    stack.register_node("node-1", count=3)
    jobs = {name: submit(batch, name, "QS1", p) for name, p in (("qs1_job_high", 3), ("qs1_job_med", 2))}
    jobs["qs1_job_low"] = submit(batch, "qs1_job_low", "QS1", 1)
    for name in ("qs1_job_high", "qs1_job_med"):
        stack.report(jobs[name], "STARTING")
        stack.report(jobs[name], "RUNNING")
    jobs["qs2_job_1"] = submit(batch, "qs2_job_1", "QS2", 1)
    stack.report(jobs["qs1_job_med"], "STOPPED")
    stack.report(jobs["qs2_job_1"], "STARTING")
    stack.report(jobs["qs2_job_1"], "RUNNING")
    assert status(batch, jobs["qs1_job_med"]) == "RUNNABLE"
    return jobs
