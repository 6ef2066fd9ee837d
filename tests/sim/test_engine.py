"""The replay on small traces whose every figure can be worked out by hand.

The worked example's configuration: 3 x g5; QS1 (limit 1) borrows, QS2 (limit 1) lends, QS3 (limit 1)
reserves. ``a`` runs in QS1's quota; ``b`` borrows QS2's idle instance until QS2's job ``c`` arrives
at 50 s and reclaims it; ``c`` ends at 60 s and ``b`` borrows again.
"""

from __future__ import annotations

from pathlib import Path

from gpuquota.sim.config import load_configuration
from gpuquota.sim.engine import simulate
from gpuquota.sim.report import as_json, table
from gpuquota.sim.trace import TraceJob

CONFIG = load_configuration(Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml")
G5 = "ml.g5.xlarge"


def trace(checkpoint: float | None = None, retries: int | None = None) -> list[TraceJob]:
    return [
        TraceJob(submitted_at=0, share="QS1", unit=G5, duration=100, job_name="a"),
        TraceJob(
            submitted_at=0,
            share="QS1",
            unit=G5,
            duration=100,
            checkpoint_every=checkpoint,
            preemption_retries=retries,
        ),
        TraceJob(submitted_at=50, share="QS2", unit=G5, duration=10),
    ]


def test_a_preempted_job_resumes_from_its_last_checkpoint() -> None:
    result = simulate(CONFIG, trace(checkpoint=30), record_decisions=True)
    assert result.decisions == [
        ("dispatch", "j0"),
        ("dispatch", "j1"),
        ("preempt", "j1"),
        ("dispatch", "j2"),
        ("dispatch", "j1"),
    ]
    qs1, qs2, qs3 = result.counters
    assert (qs1.finished, qs2.finished, qs3.finished) == (2, 1, 0)
    assert qs1.preemptions == 1 and qs1.lost_ms == 20_000  # ran 50 s, saved at 30 s
    assert result.end_ms == 130_000  # b resumed at 60 s with 70 s left
    # b borrowed 0-50 s and 60-100 s; once a ended at 100 s, b ran in QS1's own quota
    assert result.borrowed_ms[0] == result.lent_ms[1] == 90_000
    assert result.used_ms == [100_000 + 120_000, 10_000, 0]
    assert qs2.waits.max_seconds == 0 and qs1.waits.quantile(0.95) == 0


def test_without_checkpoints_a_preempted_job_starts_over() -> None:
    result = simulate(CONFIG, trace())
    assert result.end_ms == 160_000 and result.counters[0].lost_ms == 50_000


def test_a_job_out_of_preemption_retries_fails() -> None:
    result = simulate(CONFIG, trace(retries=0))
    qs1 = result.counters[0]
    assert (qs1.finished, qs1.failed, qs1.failed_by_preemption, qs1.preemptions) == (1, 1, 1, 1)
    assert result.end_ms == 100_000


def test_finished_jobs_are_not_kept() -> None:
    jobs = [TraceJob(submitted_at=i, share="QS3", unit=G5, duration=0.5) for i in range(1000)]
    from gpuquota.sim.engine import Replay

    replay = Replay(CONFIG)
    result = replay.run(jobs)
    assert result.counters[2].finished == 1000
    assert replay.jobs == {} and replay.state.jobs == {} and replay.heap == []


def test_jobs_the_configuration_cannot_take_are_counted_as_rejected() -> None:
    jobs = [
        TraceJob(submitted_at=0, share="QS1", unit="ml.p5.48xlarge", duration=1),
        TraceJob(submitted_at=0, share="NOPE", unit=G5, duration=1),
    ]
    result = simulate(CONFIG, jobs)
    assert result.counters[0].rejected == 1 and result.counters[0].finished == 0


def test_the_report_puts_configurations_side_by_side() -> None:
    first = simulate(CONFIG, trace(checkpoint=30))
    second = simulate(CONFIG, trace())
    data = as_json([first, second])
    qs1 = [c["shares"]["QS1"] for c in data["configurations"]]
    assert [q["preempted_gpu_hours"] for q in qs1] == [round(20 / 3600, 2), round(50 / 3600, 2)]
    assert qs1[0]["gpu_hours_borrowed"] == round(90 / 3600, 2)
    pool = data["configurations"][0]["shares"]["(pool)"]
    assert pool["jobs_finished"] == 3 and pool["preemptions"] == 1
    assert pool["utilisation"] == round(230 / (3 * 130), 3)
    text = table([first, second])
    assert text.splitlines()[0].split() == ["share", "metric", "worked-example.yaml", "worked-example.yaml"]
    assert "preempted GPU-hours" in text and "(pool)" in text
