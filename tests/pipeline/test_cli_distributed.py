"""``gpuquota jobs submit / logs / nodes`` against the distributed mode: ``gpuquota gateway``,
``gpuquota scheduler`` and ``gpuquota node-agent --logs-port`` as separate processes; the gateway reads
the attempt's log from the node agent's log server (``GPUQUOTA_NODE_LOGS_URL``), showing it the node
token (``GPUQUOTA_NODE_TOKEN_FILE``)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import boto3
import pytest

from tests.gateway.helpers import worked_example
from tests.pipeline.services import Services, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # about 50 s on a loaded machine

NODE = "127.0.0.1"  # a node id that is also its host name: the URL template resolves it
SCRIPT = "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)"


async def gpuquota(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuquota", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_follow_logs_and_drain_across_processes(services: Services, tmp_path: Path) -> None:
    port, logs_port = free_port(), free_port()
    token = tmp_path / "node-token"  # the log server listens on 0.0.0.0: the gateway shows the token
    token.write_text("a-node-token-of-this-test\n")
    logs_url = f"http://{{node_id}}:{logs_port}"
    agent_env = {"GPUQUOTA_RUNTIME": "process", "GPUQUOTA_NODE_TOKEN_FILE": str(token)}
    running = [
        services.scheduler(),
        services.gateway(port, GPUQUOTA_NODE_LOGS_URL=logs_url, GPUQUOTA_NODE_TOKEN_FILE=str(token)),
        services.node_agent(NODE, args=["--logs-port", str(logs_port)], env=agent_env),
    ]
    endpoint = ("--endpoint", f"http://127.0.0.1:{port}")
    await asyncio.gather(*(service.start() for service in running))
    batch = boto3.client(
        "batch",
        endpoint_url=endpoint[1],
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
    )
    await asyncio.to_thread(worked_example, batch)
    rc, out, err = await gpuquota(
        *endpoint, "jobs", "submit", "--queue", "jq", "--share", "QS1", "--unit", "ml.g5.xlarge",
        "--", sys.executable, "-c", SCRIPT,
    )  # fmt: skip
    assert rc == 0, err
    job_id = out.strip()
    rc, out, err = await gpuquota(*endpoint, "jobs", "logs", job_id, "--follow")
    assert (rc, out) == (0, "line 0\nline 1\nline 2\n"), err

    rc, out, err = await gpuquota(*endpoint, "-o", "json", "nodes", "drain", NODE)
    assert (rc, json.loads(out)) == (0, {"nodeId": NODE, "state": "DRAINING"}), err
    rc, out, err = await gpuquota(*endpoint, "nodes", "-o", "json")
    (node,) = json.loads(out)["nodes"]
    assert (node["nodeId"], node["state"], node["slots"]) == (NODE, "DRAINING", {"ml.g5.xlarge": 3})
    assert all(service.alive for service in running)
