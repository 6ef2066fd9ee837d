"""``RegisterAgain``: the scheduler declared the node lost (or does not know it) while its agent runs.

The agent sends its ``RegisterNode`` again and re-reports the attempts it still runs, so that the
scheduler, which requeued them, fences them (``StopAttempt``).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from gpuquota.node_agent import SimulatedRuntime
from gpuquota.wire.inputs import AttemptReport, DrainNode, RegisterNode
from gpuquota.wire.node_commands import RegisterAgain
from tests.node_agent.conftest import NODE, AgentFactory, Scheduler, run_cmd, stop_cmd, wait_final, wait_until
from tests.node_agent.test_simulated_and_restart import sim_payload

REASON = f"Node {NODE} is not registered; register it again"


def register_again(node_id: str = NODE) -> RegisterAgain:
    return RegisterAgain(
        event_id=str(uuid.uuid4()), occurred_at=int(time.time() * 1000), node_id=node_id, reason=REASON
    )


def sent_since(sched: Scheduler, start: int) -> list[tuple[str, str]]:
    """(type, status or "") of the inputs sent from index ``start`` on."""
    return [(m.type, m.status if isinstance(m, AttemptReport) else "") for m in sched.inputs[start:]]


async def test_register_again_re_registers_and_re_reports_running_attempts(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime(), slots="ml.g5.xlarge=2")
    await agent.start()
    await agent.deliver(run_cmd(sim_payload(3600), job_id="long", slots=(0,)))
    await agent.deliver(run_cmd(sim_payload(0.01), job_id="short", slots=(1,)))
    await wait_until(lambda: "RUNNING" in sched.statuses("long-a1"), what="long RUNNING")
    assert (await wait_final(sched, "short-a1")).status == "SUCCEEDED"
    await agent.flush(5)
    (first,) = [m for m in sched.inputs if isinstance(m, RegisterNode)]
    before = len(sched.inputs)

    # several in a row (one per rejected heartbeat): one registration while the first is on its way
    for _ in range(3):
        await agent.deliver(register_again())
    await agent.flush(5)
    assert sent_since(sched, before) == [("RegisterNode", "")]
    again = sched.inputs[before]
    assert isinstance(again, RegisterNode)
    assert (again.node_id, again.pool, again.slots) == (first.node_id, first.pool, first.slots)
    # it lists the attempts the node runs: the scheduler fences those it no longer assigns
    assert [(a.attempt_id, a.status) for a in again.attempts or ()] == [("long-a1", "RUNNING")]
    assert again.event_id != first.event_id
    assert agent.registrations == 2

    # later ones (the scheduler answered heartbeats sent before the registration arrived): harmless
    before = len(sched.inputs)
    await agent.deliver(register_again())
    await agent.flush(5)
    assert sent_since(sched, before) == [("RegisterNode", "")]

    # the scheduler fences the stale attempt: it stops, reported once
    await agent.deliver(stop_cmd("long", "long-a1", "The scheduler does not assign this attempt to the node"))
    assert (await wait_final(sched, "long-a1", timeout=5)).status == "STOPPED"
    await agent.flush(5)
    assert sched.statuses("long-a1") == ["STARTING", "RUNNING", "STOPPED"]
    assert agent.active_attempts == []

    # nothing runs any more: only the registration
    before = len(sched.inputs)
    await agent.deliver(register_again())
    await agent.flush(5)
    assert sent_since(sched, before) == [("RegisterNode", "")]


async def test_register_again_for_another_node_or_after_drain_is_ignored(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime())
    await agent.start()
    await agent.flush(5)
    await agent.deliver(register_again("node-2"))
    await agent.flush(5)
    assert sched.types() == ["RegisterNode"]
    await agent.drain(timeout=5)
    assert sched.types() == ["RegisterNode", "DrainNode", "DeregisterNode"]
    await agent.deliver(register_again())
    assert sched.types() == ["RegisterNode", "DrainNode", "DeregisterNode"]
    assert agent.registrations == 1


async def test_a_draining_node_registered_again_drains_again(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime())
    await agent.start()
    await agent.deliver(run_cmd(sim_payload(3600), job_id="long"))
    await wait_until(lambda: "RUNNING" in sched.statuses("long-a1"), what="long RUNNING")
    draining = asyncio.create_task(agent.drain(timeout=60))
    await wait_until(lambda: "DrainNode" in sched.types(), what="DrainNode")
    before = len(sched.inputs)
    await agent.deliver(register_again())
    await agent.flush(5)
    # registered again, the scheduler would give the node new work: the agent drains it again
    expected = [("RegisterNode", ""), ("DrainNode", "")]
    assert sent_since(sched, before) == expected
    assert isinstance(sched.inputs[-1], DrainNode)
    await agent.deliver(stop_cmd("long", "long-a1"))
    await asyncio.wait_for(draining, 10)
    assert sched.types()[-2:] == ["AttemptReport", "DeregisterNode"]
