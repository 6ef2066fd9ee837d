"""Heartbeats: on time while the outbox is busy; never before the RegisterNode nor while the link is down."""

from __future__ import annotations

import asyncio

from gpuquota.wire.inputs import AttemptReport, SchedulerInput
from tests.node_agent.conftest import AgentFactory, Scheduler, python_payload, run_cmd, wait_final, wait_until


class Link(Scheduler):
    """The twin with a gate on attempt reports (a slow link) and a record of every send tried."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.tried: list[tuple[str, bool]] = []

    async def send(self, message: SchedulerInput) -> None:
        if isinstance(message, AttemptReport):
            await self.gate.wait()
        try:
            await super().send(message)
        except ConnectionError:
            self.tried.append((message.type, False))
            raise
        self.tried.append((message.type, True))

    def heartbeats(self) -> int:
        return self.types().count("NodeHeartbeat")


async def test_heartbeats_keep_going_while_reports_queue_up(make_agent: AgentFactory) -> None:
    link = Link()
    link.gate.clear()  # reports wait: the outbox stays busy
    agent = make_agent(link, heartbeat=0.02)
    await agent.start()
    await agent.deliver(run_cmd(python_payload("pass")))
    await wait_until(lambda: "RegisterNode" in link.types(), what="registration")
    before = link.heartbeats()
    await wait_until(lambda: link.heartbeats() >= before + 3, what="heartbeats while reports wait")
    assert link.reports() == []
    link.gate.set()
    assert (await wait_final(link, "job-1-a1")).status == "SUCCEEDED"
    assert link.statuses("job-1-a1") == ["STARTING", "RUNNING", "SUCCEEDED"]


async def test_no_heartbeat_before_registration_or_while_the_link_is_down(make_agent: AgentFactory) -> None:
    link = Link()
    link.fail_next = 5  # the RegisterNode fails five times
    agent = make_agent(link, heartbeat=0.01)
    await agent.start()
    await wait_until(lambda: link.heartbeats() >= 2, what="heartbeats after registration")
    assert link.tried[:6] == [("RegisterNode", False)] * 5 + [("RegisterNode", True)]
    # the link goes down: the outbox retries its report, heartbeats stop until a send succeeds again
    link.fail_next = 10**9
    await agent.deliver(run_cmd(python_payload("pass")))
    await wait_until(lambda: agent.send_failures >= 5 + 8, what="retries while the link is down")
    down = len(link.tried)
    await wait_until(lambda: agent.send_failures >= 5 + 12, what="more retries")
    assert {kind for kind, _ in link.tried[down:]} == {"AttemptReport"}
    link.fail_next = 0
    assert (await wait_final(link, "job-1-a1")).status == "SUCCEEDED"
    await wait_until(lambda: link.tried[-1] == ("NodeHeartbeat", True), what="heartbeats again")
