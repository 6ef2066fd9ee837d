"""The scoped pass (only units an input touched) decides exactly what a full pass decides."""

from __future__ import annotations

import random
from typing import Any

import pytest

from benchmarks import core as workload
from gpuquota.core import schedule
from gpuquota.core.context import Context
from gpuquota.native import loader as _native
from gpuquota.wire import inputs as inp


def recorded_events(full_pass: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    if full_pass:
        original = schedule.EnvironmentPass.__init__

        def unscoped(self: schedule.EnvironmentPass, ctx: Context, environment: Any) -> None:
            ctx.dirty = None
            original(self, ctx, environment)

        monkeypatch.setattr(schedule.EnvironmentPass, "__init__", unscoped)
    driver = workload.Driver(random.Random(3))
    workload.setup_cluster(driver)
    events = []
    for index in range(1500):
        events += driver.feed(driver.message(inp.SubmitJob, job=driver.job(index)))
    for serial in range(1500, 4500):
        events += driver.feed(workload.next_input(driver, serial))
    monkeypatch.undo()
    return [event.model_dump() for event in events]


@pytest.mark.skipif(
    _native.core_mode() == "compiled",
    reason="patches the pass, which compiled callers do not see; `make test` runs it on the Python core",
)
def test_scoped_pass_equals_full_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    scoped = recorded_events(False, monkeypatch)
    full = recorded_events(True, monkeypatch)
    assert len(scoped) > 5000
    assert scoped == full


def test_step_equals_decide_then_evolve() -> None:
    """``step`` applies exactly the events ``decide`` returns, and reaches the same state."""
    from gpuquota.core import ClusterState, decide, evolve, fingerprint, step

    reference = workload.Driver(random.Random(5))
    workload.setup_cluster(reference)
    fused = ClusterState(heartbeat_timeout_ms=reference.state.heartbeat_timeout_ms)
    messages = []
    for index in range(800):
        messages.append(reference.message(inp.SubmitJob, job=reference.job(index)))
        reference.feed(messages[-1])
    for serial in range(800, 2500):
        messages.append(workload.next_input(reference, serial))
        reference.feed(messages[-1])
    replayed = ClusterState(heartbeat_timeout_ms=reference.state.heartbeat_timeout_ms)
    setup = workload.Driver(random.Random(5), state=replayed)
    workload.setup_cluster(setup)
    fused_setup = workload.Driver(random.Random(5), state=fused)
    workload.setup_cluster(fused_setup)
    for message in messages:
        events = decide(replayed, message)
        for event in events:
            evolve(replayed, event)
        assert [e.model_dump() for e in step(fused, message)] == [e.model_dump() for e in events]
    assert fingerprint(fused) == fingerprint(replayed) == fingerprint(reference.state)
