"""Where an attempt kept its model (I6): the final report names each instance's ``/opt/ml/model`` and
``/opt/ml/output`` directories, and what the job wrote to ``$SM_MODEL_DIR`` is there."""

from __future__ import annotations

from pathlib import Path

from gpuquota.node_agent import SimulatedRuntime
from tests.node_agent.conftest import AgentFactory, Scheduler, python_payload, run_cmd, wait_final

WRITE_MODEL = (
    "import os, pathlib\n"
    "pathlib.Path(os.environ['SM_MODEL_DIR'], 'model.bin').write_text('weights')\n"
    "pathlib.Path(os.environ['SM_OUTPUT_DATA_DIR'], 'metrics.json').write_text('{}')\n"
)


async def test_a_process_attempt_reports_its_model_directory(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched)
    await agent.start()
    await agent.deliver(run_cmd(python_payload(WRITE_MODEL), job_id="model"))
    report = await wait_final(sched, "model-a1", 30)
    assert report.status == "SUCCEEDED", report.status_reason
    (output,) = report.outputs
    root = agent.work_dir / "attempts" / "model-a1" / "algo-1"
    assert (output.host, output.model_dir, output.output_dir) == (
        "algo-1",
        str(root / "model"),
        str(root / "output"),
    )
    assert (Path(output.model_dir) / "model.bin").read_text() == "weights"
    assert (Path(output.output_dir) / "data" / "metrics.json").exists()
    assert all(not r.outputs for r in sched.reports("model-a1") if r.status in ("STARTING", "RUNNING"))


async def test_a_simulated_attempt_keeps_nothing(make_agent: AgentFactory) -> None:
    sched = Scheduler()
    agent = make_agent(sched, runtime=SimulatedRuntime(default_duration=0))
    await agent.start()
    await agent.deliver(run_cmd(python_payload("pass"), job_id="sim"))
    report = await wait_final(sched, "sim-a1", 30)
    assert report.status == "SUCCEEDED" and report.outputs == ()
