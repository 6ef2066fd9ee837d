"""``kill -9`` of the Kafka broker for longer than the node-lost timeout while long jobs run (issue #30;
distributed mode: ``gpuquota scheduler`` and two ``gpuquota node-agent`` processes over a dedicated
broker from ``deploy/local/kafka.sh`` and the real PostgreSQL).

While the broker is away no heartbeat reaches the scheduler, which keeps ticking (its database is
up): every node of the pool is silent at once, so it suspends node loss (``NodeLossSuspended``)
instead of declaring both nodes lost and requeueing every job while their processes run on. Once the
broker is back, the first heartbeat resumes it (``NodeLossResumed``, every timer restarted) and the
nodes report again. Checked: no node lost, no job requeued, each job ran once and succeeded once
(``faults.check_events``), and the time from the broker's return until heartbeats flow again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpuquota.wire import events as ev
from tests.e2e.conftest import Cluster, apoll
from tests.e2e.faults import Client, check_events, settle, setup_queue, statuses
from tests.pipeline.test_faults import RestartableBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_SECONDS = 1.0
TIMEOUT_SECONDS = 6 * HEARTBEAT_SECONDS
OUTAGE_SECONDS = 3 * TIMEOUT_SECONDS
"""How long the broker stays away at least (its own restart takes 10-15 s more on top)."""


class KillableBroker(RestartableBroker):
    async def kill_9(self, hold: float) -> float:
        """SIGKILL the broker, keep it away ``hold`` seconds, start it again; the seconds it was away."""
        pid = int(self.pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        began = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(hold)  # the fault's duration, not a synchronisation
        with (self.service.run_dir / "logs" / "server.out").open("ab") as out:
            self.relaunched = subprocess.Popen(
                [part.decode() for part in cmdline], stdout=out, stderr=out, start_new_session=True
            )
        self.pid_file.write_text(str(self.relaunched.pid))
        await apoll(self._accepts, 90, "the broker to accept produce requests again", interval=0.5)
        return time.monotonic() - began


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[KillableBroker]:
    made = KillableBroker()
    try:
        await asyncio.to_thread(made.start)
    except Exception as exc:
        await asyncio.to_thread(made.stop)
        pytest.skip(f"no dedicated broker: {exc}")
    try:
        yield made
    finally:
        await asyncio.to_thread(made.stop)


async def test_broker_killed_longer_than_the_node_lost_timeout_loses_no_node(
    broker: KillableBroker, database_url: str, tmp_path: Path
) -> None:
    cluster = Cluster(broker.bootstrap, database_url, tmp_path, heartbeat_seconds=HEARTBEAT_SECONDS)
    try:
        await cluster.start()
        nodes = [cluster.node_id("a"), cluster.node_id("b")]
        agents = [cluster.agent(node, "ml.g5.xlarge=2") for node in nodes]
        await asyncio.gather(*(agent.start() for agent in agents))
        await apoll(lambda: cluster.online() == set(nodes), 30, "both nodes to register")
        url = cluster.gateway.url
        await asyncio.to_thread(setup_queue, url, 4)
        client = Client(lambda: url, tmp_path, 4, ticks=[20 * 60 * 10])  # 10 min, or until released
        client.start()
        await client.wait(timeout=60)
        jobs = list(client.acknowledged.values())

        async def all_running() -> bool:
            found = await asyncio.to_thread(statuses, url, jobs)
            return set(found.values()) == {"RUNNING"}

        await apoll(all_running, 60, "four jobs to run")
        away = await broker.kill_9(OUTAGE_SECONDS)
        back = time.monotonic()

        async def heartbeats_flow() -> bool:
            events = await cluster.events()
            resumed = [i for i, e in enumerate(events) if isinstance(e, ev.NodeLossResumed)]
            if not resumed:
                return False
            after = events[resumed[-1] :]
            beating = {e.node_id for e in after if isinstance(e, ev.NodeHeartbeatRecorded)}
            return beating == set(nodes)

        await apoll(heartbeats_flow, 120, "both nodes' heartbeats to be recorded again")
        recovery = time.monotonic() - back
        (tmp_path / "release").write_text("now")
        await settle(url, jobs, 120, cluster.logs)
        events = await cluster.events()
        figures = check_events(events, tmp_path, client.acknowledged)
        figures.recovery_seconds = [recovery]
        print(figures.line(f"broker kill -9, away {away:.1f} s (node-lost timeout {TIMEOUT_SECONDS:g} s)"))
        assert not [e for e in events if isinstance(e, ev.NodeLost)], "a node was declared lost"
        assert figures.requeued == 0, "a job was requeued"
        assert [e.pool for e in events if isinstance(e, ev.NodeLossSuspended)] == [cluster.pool]
        said = cluster.scheduler.log_path.read_text(errors="replace")
        assert "node loss suspended in pool" in said and "node loss resumed in pool" in said
    finally:
        print(cluster.logs())
        await cluster.stop()
