"""Preemption end to end on one node: SIGTERM, checkpoint, STOPPED, and the next attempt resumes."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from tests.node_agent.conftest import (
    AgentFactory,
    Scheduler,
    python_payload,
    run_cmd,
    stop_cmd,
    wait_final,
    wait_until,
)

TRAINER = textwrap.dedent(
    """
    import json, os, signal, sys, time, pathlib
    ckpt = pathlib.Path(os.environ["SM_CHECKPOINT_DIR"]) / "state.json"
    out = pathlib.Path(os.environ["OUT_DIR"])
    attempt = os.environ["GPUQUOTA_ATTEMPT"]
    step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0

    def on_sigterm(*_):
        ckpt.write_text(json.dumps({"step": step}))
        (out / f"checkpoint-{attempt}.json").write_text(json.dumps({"step": step, "at": time.time()}))
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    (out / f"start-{attempt}.json").write_text(json.dumps({"resumed_from": step, "at": time.time()}))
    target = int(os.environ.get("TARGET_STEPS", "1000000"))
    while step < target:
        step += 1
        time.sleep(0.005)
    ckpt.write_text(json.dumps({"step": step}))
    """
)


async def test_preemption_checkpoints_and_the_next_attempt_resumes(
    make_agent: AgentFactory, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    sched = Scheduler()
    agent = make_agent(sched, grace=5)
    await agent.start()
    t0 = time.time()

    payload = python_payload(TRAINER, Environment={"OUT_DIR": str(out)})
    await agent.deliver(run_cmd(payload, job_id="train", attempt_number=1))
    await wait_until(lambda: (out / "start-1.json").exists(), what="attempt 1 to start")
    await wait_until(lambda: "RUNNING" in sched.statuses("train-a1"), what="RUNNING")
    await wait_until(lambda: agent.trace and time.time() - t0 > 0.3, what="some training")  # let it train

    await agent.deliver(stop_cmd("train", "train-a1", "Preempted (cross-share): capacity reclaimed"))
    stopped = await wait_final(sched, "train-a1")
    assert stopped.status == "STOPPED"
    assert stopped.status_reason == "Preempted (cross-share): capacity reclaimed"
    checkpoint = json.loads((out / "checkpoint-1.json").read_text())
    assert checkpoint["step"] > 0

    # the scheduler requeues the job; its next attempt (maybe on other slots) resumes from the checkpoint
    payload2 = python_payload(
        TRAINER, Environment={"OUT_DIR": str(out), "TARGET_STEPS": str(checkpoint["step"] + 5)}
    )
    await agent.deliver(run_cmd(payload2, job_id="train", attempt_number=2, slots=(1,)))
    done = await wait_final(sched, "train-a2")
    assert done.status == "SUCCEEDED"
    resumed = json.loads((out / "start-2.json").read_text())
    assert resumed["resumed_from"] == checkpoint["step"]

    sigterm = next(at for at, aid, what in agent.trace if aid == "train-a1" and what.startswith("SIGTERM"))
    gone = next(at for at, aid, what in agent.trace if aid == "train-a1" and what.endswith("gone"))
    assert sigterm <= checkpoint["at"] <= gone <= stopped.occurred_at / 1000 + 0.001
    reported = next(
        at for at, aid, what in agent.trace if aid == "train-a1" and what.startswith("report STOPPED")
    )
    assert gone <= reported
    assert not any("SIGKILL" in what for _, _, what in agent.trace)

    timeline = [
        (sigterm, "SIGTERM sent to the process group of train-a1"),
        (checkpoint["at"], f"checkpoint written by the job (step {checkpoint['step']})"),
        (gone, "process group gone"),
        (reported, "STOPPED report queued for the scheduler"),
        (stopped.occurred_at / 1000, "STOPPED report occurred_at (whole ms)"),
        (resumed["at"], f"attempt 2 started, resumed from step {resumed['resumed_from']}"),
        (done.occurred_at / 1000, "attempt 2 SUCCEEDED"),
    ]
    print("\npreemption timeline (ms after SIGTERM):")
    for at, what in timeline:
        print(
            f"  {time.strftime('%H:%M:%S', time.localtime(at))}.{int(at * 1000) % 1000:03d}"
            f"  +{(at - sigterm) * 1000:8.1f} ms  {what}"
        )
