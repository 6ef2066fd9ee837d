"""``gpuquota jobs submit``, ``jobs logs``, ``nodes`` and ``--watch`` through the real CLI (I9).

Most tests play the node agent (``stack.report``); ``test_submit_follow_logs_with_real_agents`` runs
an embedded stack with a real ``process`` node agent, as ``gpuquota up`` does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuquota.ctl.api import poll
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import SlotOffer
from tests.cli.conftest import Cli, play_worked_example
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import status, worked_example

G5 = "ml.g5.xlarge"


def submit_argv(*extra: str) -> list[str]:
    return ["jobs", "submit", "--queue", "jq", "--share", "QS1", *extra]


def test_submit_a_command_and_a_payload_file(stack: StackThread, cli: Cli, tmp_path: Path) -> None:
    batch: Any = stack.client
    worked_example(batch)
    result = cli(*submit_argv("--priority", "5", "--unit", G5, "--", "python3", "-c", "print('hi')"))
    assert result.rc == 0, result.err
    job_id = result.out.strip()
    job = batch.describe_service_job(jobId=job_id)
    assert (job["jobName"], job["schedulingPriority"], job["quotaShareName"]) == ("python3", 5, "QS1")
    payload = json.loads(job["serviceRequestPayload"])
    assert payload["AlgorithmSpecification"]["ContainerEntrypoint"] == ["python3", "-c", "print('hi')"]
    assert payload["ResourceConfig"] == {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 1}

    file = tmp_path / "train.json"
    file.write_text(json.dumps({"TrainingJobName": "train", "ResourceConfig": {"InstanceType": G5}}))
    out = cli(*submit_argv("-f", str(file), "--instances", "2", "-o", "json"))
    assert out.rc == 0, out.err
    submitted = json.loads(out.out)
    assert submitted["jobName"] == "train" and submitted["jobArn"].endswith(submitted["jobId"])
    described = batch.describe_service_job(jobId=submitted["jobId"])
    assert described["capacityUsage"] == [{"capacityUnit": G5, "quantity": 2}]


@pytest.mark.parametrize(
    ("argv", "rc", "message"),
    [
        (submit_argv("--unit", G5), 2, "give either -f PAYLOAD.json or -- CMD ... / --image (one of them)"),
        (submit_argv("--", "true"), 1, "gpuquota jobs submit: --unit is required with a command"),
        (submit_argv("-f", "/nonexistent.json"), 1, "gpuquota jobs submit: cannot read /nonexistent.json"),
        (
            ["jobs", "submit", "--queue", "jq", "--share", "QSX", "--unit", G5, "--", "true"],
            1,
            "gpuquota jobs submit: Quota share QSX does not exist in job queue jq",
        ),
        (submit_argv("--priority", "10000", "--unit", G5, "--", "true"), 1, "between 0 and 9999"),
        (["jobs", "submit", "--share", "QS1"], 2, "the following arguments are required: --queue"),
    ],
)
def test_submit_errors(stack: StackThread, cli: Cli, argv: list[str], rc: int, message: str) -> None:
    worked_example(stack.client)
    result = cli(*argv)
    assert (result.rc, result.out) == (rc, "")
    assert message in result.err and "Traceback" not in result.err
    if rc == 2:
        assert result.err.startswith("usage: gpuquota jobs submit")


def test_submit_a_file_that_is_not_json(stack: StackThread, cli: Cli, tmp_path: Path) -> None:
    worked_example(stack.client)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = cli(*submit_argv("-f", str(bad)))
    assert result.rc == 1 and result.err.startswith(f"gpuquota jobs submit: {bad} is not JSON")


def test_nodes_list_drain_and_undrain(stack: StackThread, cli: Cli) -> None:
    jobs = play_worked_example(stack)
    table = cli("nodes")
    assert table.rc == 0, table.err
    header, row = (line.split() for line in table.out.strip().splitlines())
    assert header[:3] == ["NODE", "POOL", "STATE"]
    assert row[:5] == ["node-1", "default", "READY", G5, "2/3"]
    data = json.loads(cli("nodes", "list", "-o", "json").out)["nodes"]
    (node,) = data
    assert node["slots"] == {G5: 3} and node["usedSlots"] == {G5: 2} and node["gpus"] == 3
    assert sorted(a["jobName"] for a in node["attempts"]) == ["qs1_job_high", "qs2_job_1"]
    assert node["heartbeatAgeSeconds"] >= 0

    drained = cli("nodes", "drain", "node-1")
    assert (drained.rc, drained.out) == (0, "node node-1: DRAINING\n")
    assert stack.state.nodes["node-1"].draining
    assert json.loads(cli("-o", "json", "nodes").out)["nodes"][0]["state"] == "DRAINING"
    # its running attempts go on; the terminated job's slot is not given to the waiting med
    stack.client.terminate_service_job(jobId=jobs["qs2_job_1"], reason="x")
    stack.report(jobs["qs2_job_1"], "STOPPED")
    assert status(stack.client, jobs["qs1_job_high"]) == "RUNNING"
    assert status(stack.client, jobs["qs1_job_med"]) == "RUNNABLE"

    undrained = cli("nodes", "undrain", "node-1", "-o", "json")
    assert (undrained.rc, json.loads(undrained.out)) == (0, {"nodeId": "node-1", "state": "READY"})
    assert status(stack.client, jobs["qs1_job_med"]) == "SCHEDULED"

    unknown = cli("nodes", "drain", "nope")
    assert (unknown.rc, unknown.err) == (1, "gpuquota nodes: Node nope is not registered\n")


def test_nodes_show_the_address_they_advertised(stack: StackThread, cli: Cli) -> None:
    slots = (SlotOffer(unit=G5, gpus=(0,)),)
    stack.feed(inp.RegisterNode, node_id="node-a", pool=stack.pool, slots=slots, address="10.0.0.7")
    stack.feed(inp.RegisterNode, node_id="node-b", pool=stack.pool, slots=slots)  # none advertised
    table = cli("nodes")
    assert table.rc == 0, table.err
    header, *rows = (line.split() for line in table.out.strip().splitlines())
    assert header[-1] == "ADDRESS"
    assert [(row[0], row[-1]) for row in rows] == [("node-a", "10.0.0.7"), ("node-b", "-")]
    data = json.loads(cli("nodes", "-o", "json").out)["nodes"]
    assert [(n["nodeId"], n["address"]) for n in data] == [("node-a", "10.0.0.7"), ("node-b", None)]


def test_watch_redraws_until_frames(stack: StackThread, cli: Cli) -> None:
    play_worked_example(stack)
    for argv in (("shares",), ("jobs", "list"), ("nodes",)):
        result = cli(*argv, "--watch", "--interval", "0.05", "--frames", "2")
        assert result.rc == 0, result.err
        assert result.out.count("Every 0.05s: gpuquota") == 2
    json_frames = cli("-o", "json", "nodes", "-w", "--interval", "0.05", "--frames", "3").out.splitlines()
    assert len(json_frames) == 3 and all(json.loads(f)["nodes"][0]["nodeId"] == "node-1" for f in json_frames)
    failed = cli("shares", "--queue", "nope", "--watch", "--frames", "2")
    assert (failed.rc, failed.err) == (1, "gpuquota shares: Job queue nope does not exist\n")


def test_logs_of_a_job_without_an_attempt(stack: StackThread, cli: Cli) -> None:
    jobs = play_worked_example(stack)
    low = cli("jobs", "logs", jobs["qs1_job_low"])
    assert low.rc == 1 and "has no attempt yet (status RUNNABLE)" in low.err
    too_far = cli("jobs", "logs", jobs["qs1_job_high"], "--attempt", "3")
    assert too_far.rc == 1 and "has 1 attempt(s), not 3" in too_far.err
    # a node that is not a local agent: an attempt with an empty log so far
    high = cli("jobs", "logs", jobs["qs1_job_high"])
    assert (high.rc, high.out) == (0, "")
    piece = json.loads(cli("jobs", "logs", jobs["qs1_job_high"], "-o", "json").out)
    assert piece == {
        "jobId": jobs["qs1_job_high"],
        "status": "RUNNING",
        "attempt": 1,
        "attemptId": piece["attemptId"],
        "nodeId": "node-1",
        "offset": 0,
        "nextOffset": 0,
        "text": "",
        "complete": False,
    }


@pytest.fixture
def real_stack(tmp_path: Path) -> Iterator[StackThread]:
    s = StackThread(data_dir=tmp_path, nodes=f"{G5}=2", runtime="process", tick_seconds=0.2)
    try:
        yield s
    finally:
        s.close()


SCRIPT = (
    "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.3)\nprint('é done')"
)


def test_submit_follow_logs_with_real_agents(
    real_stack: StackThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new user's path: submit a command, follow its log until it ends, read it again later."""
    cli = Cli(capsys, real_stack.url)
    worked_example(real_stack.client)
    submitted = cli(*submit_argv("--unit", G5, "--name", "hello", "--", sys.executable, "-c", SCRIPT))
    assert submitted.rc == 0, submitted.err
    job_id = submitted.out.strip()
    followed = cli("jobs", "logs", job_id, "--follow")
    assert followed.rc == 0, followed.err
    assert followed.out == "step 0\nstep 1\nstep 2\né done\n"
    done = poll(lambda: status(real_stack.client, job_id) == "SUCCEEDED" or None, deadline=_deadline(30))
    assert done, status(real_stack.client, job_id)
    again = cli("jobs", "logs", job_id, "--attempt", "1")
    assert again.out == followed.out
    nodes = json.loads(cli("nodes", "-o", "json").out)["nodes"]
    assert [n["nodeId"] for n in nodes] == ["local-1"] and nodes[0]["slots"] == {G5: 2}


def _deadline(seconds: float) -> float:
    import time

    return time.monotonic() + seconds


@pytest.mark.slow
def test_a_drain_survives_sigkill_of_gpuquota_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpuquota up`` killed with SIGKILL after a drain: the restarted stack replays it, and its local
    agent's new registration does not undo it."""
    import os
    import signal
    import subprocess

    from tests.pipeline.services import free_port

    port = free_port()
    cli = Cli(capsys, f"http://127.0.0.1:{port}")
    up = [sys.executable, "-m", "gpuquota", "up", "--port", str(port), "--data-dir", str(tmp_path / "d")]
    up += ["--runtime", "simulated"]

    def node_state() -> str | None:
        done = cli("nodes", "-o", "json")
        nodes = json.loads(done.out)["nodes"] if done.rc == 0 else []
        return str(nodes[0]["state"]) if nodes else None

    for attempt in range(2):
        proc = subprocess.Popen(
            up, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            state = poll(node_state, deadline=_deadline(60), interval=0.2)
            if attempt == 0:
                assert state == "READY"
                assert cli("nodes", "drain", "local-1").rc == 0
                assert node_state() == "DRAINING"
            else:
                assert state == "DRAINING"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_watch_redraws_in_place_on_a_terminal(stack: StackThread) -> None:
    """On a terminal the frames overwrite each other (cursor up, erase line); NO_COLOR drops colours only."""
    import os
    import pty
    import subprocess

    play_worked_example(stack)
    argv = [sys.executable, "-m", "gpuquota", "--endpoint", stack.url, "nodes", "-w"]
    argv += ["--interval", "0.1", "--frames", "2"]
    for no_color in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm", "COLUMNS": "120"}
        if no_color:
            env["NO_COLOR"] = "1"
        leader, follower = pty.openpty()
        proc = subprocess.Popen(argv, stdout=follower, stderr=follower, env=env)
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the follower side closed: the process exited
                break
            if not chunk:
                break
            out += chunk
        os.close(leader)
        assert proc.wait(timeout=60) == 0, out
        text = out.decode()
        assert text.count("Every 0.1s: gpuquota nodes") >= 2  # rich draws the last frame again at the end
        assert "\x1b[1A\x1b[2K" in text  # the second frame replaced the first
        assert ("\x1b[32mREADY" in text) is not no_color
