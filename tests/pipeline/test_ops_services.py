"""The scheduler and a node agent serve ``/metrics`` and ``/health/*`` on ``--metrics-port`` (I7), the
gateway on its port, as separate processes against the real broker and database; the agent survives a
SIGKILL and restart."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.observe.helpers import get, get_json, scrape, value
from tests.pipeline.conftest import wait_until
from tests.pipeline.services import Services, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _ready(url: str) -> bool:
    code, _ = await asyncio.to_thread(get, url + "/health/ready")
    return code == 200


async def test_scheduler_and_agent_metrics_and_health(services: Services, pool: str, run_id: str) -> None:
    scheduler_port, agent_port, gateway_port = free_port(), free_port(), free_port()
    scheduler = services.scheduler(args=["--metrics-port", str(scheduler_port)])
    node = f"node-{run_id}"
    agent_env = {"GPUQUOTA_METRICS_PORT": str(agent_port), "GPUQUOTA_LOG_FORMAT": "json"}
    agent = services.node_agent(node, env=agent_env)
    gateway = services.gateway(gateway_port)
    scheduler_url, agent_url = f"http://127.0.0.1:{scheduler_port}", f"http://127.0.0.1:{agent_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    await asyncio.gather(scheduler.start(), agent.start(), gateway.start())
    await wait_until(lambda: _ready(scheduler_url), 60, "the scheduler to be ready")
    await wait_until(lambda: _ready(agent_url), 60, "the agent to be ready")

    gpus = ("gpuquota_node_gpus", (("node", node), ("pool", pool), ("unit", "ml.g5.xlarge")))

    async def registered() -> bool:  # decided (in the state), then recorded and published (counted)
        samples = await asyncio.to_thread(scrape, scheduler_url)
        return samples.get(gpus) == 3 and samples.get(("gpuquota_inputs_decided_total", ()), 0) >= 1

    await wait_until(registered, 60, "the scheduler to count the node's GPUs and its registration")
    samples = await asyncio.to_thread(scrape, scheduler_url)
    assert value(samples, "gpuquota_pool_capacity_slots", pool=pool, unit="ml.g5.xlarge") == 3
    assert value(samples, "gpuquota_scheduling_step_seconds_count") >= 1
    assert value(samples, "gpuquota_log_append_seconds_count") >= 1
    assert any(name == "gpuquota_consumer_lag_records" for name, _ in samples)
    own = await asyncio.to_thread(scrape, agent_url)
    assert value(own, "gpuquota_node_gpus", pool=pool, node=node, unit="ml.g5.xlarge") == 3
    assert value(own, "gpuquota_agent_attempts_active", node=node) == 0
    await wait_until(lambda: _ready(gateway_url), 60, "the gateway to be ready")
    code, body = await asyncio.to_thread(get_json, gateway_url + "/health/ready")
    assert body["checks"] == {"eventLog": "ok", "broker": "ok", "readModel": "ok"}
    seen = await asyncio.to_thread(scrape, gateway_url)  # the node, as the gateway's read model has it
    assert value(seen, "gpuquota_node_gpus", pool=pool, node=node, unit="ml.g5.xlarge") == 3
    lines = [json.loads(line) for line in agent.tail(100_000).splitlines() if line.startswith("{")]
    assert lines and all(line["node_id"] == node and line["time"] and line["level"] for line in lines)

    await agent.kill()  # SIGKILL: its port must come back with the restarted agent
    code, body = await asyncio.to_thread(get_json, scheduler_url + "/health/ready")
    assert (code, body["checks"]["eventLog"], body["checks"]["broker"]) == (200, "ok", "ok")
    agent = services.node_agent(node, "agent2.log", env=agent_env)
    await agent.start()
    await wait_until(lambda: _ready(agent_url), 60, "the restarted agent to be ready")
    assert [await s.stop() for s in (gateway, agent, scheduler)] == [0, 0, 0]
