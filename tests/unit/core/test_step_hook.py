"""``step(state, input, before)``: the hook sees each event with the state just before it is applied,
as a shell does between ``decide`` and each ``evolve`` (the pipeline derives node commands there)."""

from __future__ import annotations

import random

from benchmarks import core as workload
from gpuquota.core import ClusterState, decide, evolve, fingerprint, step
from gpuquota.scheduler.commands import node_commands
from gpuquota.wire import inputs as inp
from gpuquota.wire.events import SchedulerEvent
from gpuquota.wire.node_commands import NodeCommand


def test_the_hook_sees_the_state_each_event_changes() -> None:
    reference = workload.Driver(random.Random(7))
    workload.setup_cluster(reference)
    messages = [reference.message(inp.SubmitJob, job=reference.job(index)) for index in range(600)]
    for message in messages:
        reference.feed(message)
    for serial in range(600, 2000):
        messages.append(workload.next_input(reference, serial))
        reference.feed(messages[-1])

    def cluster() -> ClusterState:
        driver = workload.Driver(random.Random(7), state=ClusterState(reference.state.heartbeat_timeout_ms))
        workload.setup_cluster(driver)
        return driver.state

    replayed, fused = cluster(), cluster()
    expected: list[NodeCommand] = []
    seen: list[NodeCommand] = []
    hooked: list[SchedulerEvent] = []

    def before(state: ClusterState, event: SchedulerEvent) -> None:
        assert state is fused
        hooked.append(event)
        seen.extend(node_commands(state, event))

    for message in messages:
        events = decide(replayed, message)
        for event in events:
            expected.extend(node_commands(replayed, event))
            evolve(replayed, event)
        start = len(hooked)
        assert step(fused, message, before) == hooked[start:]
    assert len(expected) > 500
    assert seen == expected
    assert fingerprint(fused) == fingerprint(replayed)
