"""S12 in the simulator: ``--victim-order`` and the lost GPU-hours under each order.

The worked example's configuration: QS1 runs ``a`` in its quota and ``b`` on QS2's lent instance, both
from 0 s; ``a`` checkpoints every 10 s, ``b`` never. QS2's ``c`` arrives at 55 s and reclaims one
instance. AWS's order takes ``b`` (the most recently dispatched), which loses its 55 s; leastLostWork
takes ``a``, which loses the 5 s since its checkpoint at 50 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuquota.entrypoints.cli import main
from gpuquota.sim.engine import simulate
from gpuquota.sim.trace import TraceJob, write_trace
from tests.sim.test_engine import CONFIG, G5

TRACE = [
    TraceJob(submitted_at=0, share="QS1", unit=G5, duration=100, job_name="a", checkpoint_every=10),
    TraceJob(submitted_at=0, share="QS1", unit=G5, duration=100, job_name="b"),
    TraceJob(submitted_at=55, share="QS2", unit=G5, duration=10, job_name="c"),
]


@pytest.mark.parametrize(
    ("order", "victim", "lost_ms"), [("aws", "j1", 55_000), ("leastLostWork", "j0", 5_000)]
)
def test_the_order_decides_the_victim_and_the_work_lost(order: str, victim: str, lost_ms: int) -> None:
    result = simulate(CONFIG.with_victim_order(order), TRACE, record_decisions=True)
    assert result.decisions is not None
    assert [job for what, job in result.decisions if what == "preempt"] == [victim]
    assert result.counters[0].lost_ms == lost_ms
    assert result.name == f"worked-example.yaml ({order})"


def test_the_file_s_own_tag_is_the_order_without_the_flag() -> None:
    assert CONFIG.victim_order() == "aws"
    assert CONFIG.with_victim_order("leastLostWork").victim_order() == "leastLostWork"


def test_simulate_runs_each_configuration_under_each_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.jsonl"
    with path.open("w") as out:
        write_trace(TRACE, out)
    example = Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml"
    argv = ["simulate", "-f", str(example), "--trace", str(path), "--quiet", "--output", "json"]
    assert main([*argv, "--victim-order", "aws,leastLostWork"]) == 0
    data = json.loads(capsys.readouterr().out)
    runs = {c["configuration"]: c["shares"]["QS1"]["preempted_gpu_hours"] for c in data["configurations"]}
    assert runs == {
        "worked-example.yaml (aws)": round(55 / 3600, 2),
        "worked-example.yaml (leastLostWork)": round(5 / 3600, 2),
    }
    assert main([*argv, "--victim-order", "fewestVictims"]) == 1
    assert "--victim-order" in capsys.readouterr().err
