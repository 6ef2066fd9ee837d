"""The start estimate of ``gpuquota explain``: the state simulated forward, on a case worked by hand.

The worked example's QS3 (RESERVE, one instance): r0 ran 40 s (the share's median), r1 runs since
50 s with a 300 s timeout, r2 waits behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuquota.core import ClusterState, fingerprint, step
from gpuquota.read.model import ReadModel
from gpuquota.sim.config import load_configuration
from gpuquota.sim.estimate import estimate
from gpuquota.sim.explainer import EstimatingExplainer
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import JobSpec

CONFIG = load_configuration(Path(__file__).parents[2] / "deploy" / "examples" / "worked-example.yaml")
QUEUE = CONFIG.queue.name


class Cluster:
    def __init__(self) -> None:
        self.state = ClusterState(10**12)
        self.read_model = ReadModel()
        self.serial = 0
        for kind, fields in CONFIG.setup():
            self.feed(kind, 0, **fields)

    def feed(self, kind: type[Any], at: int, **fields: Any) -> list[Any]:
        self.serial += 1
        events = step(self.state, kind(event_id=f"i{self.serial}", occurred_at=at, **fields))
        for event in events:
            self.read_model.apply(event)
        return events

    def submit(self, name: str, at: int, timeout: int | None = None) -> None:
        job = JobSpec(
            job_id=name,
            job_name=name,
            job_queue=QUEUE,
            quota_share="QS3",
            unit="ml.g5.xlarge",
            created_at=at,
            attempt_duration_seconds=timeout,
        )
        self.feed(inp.SubmitJob, at, job=job)

    def succeed(self, name: str, at: int) -> None:
        job = self.state.jobs[name]
        assert job.attempt_id is not None
        self.feed(
            inp.AttemptReport,
            at,
            node_id=job.placements[0].node_id,
            job_id=name,
            attempt_id=job.attempt_id,
            status="SUCCEEDED",
        )


def cluster(timeout: int | None) -> Cluster:
    c = Cluster()
    c.submit("r0", 0)
    c.succeed("r0", 40_000)
    c.submit("r1", 50_000, timeout)
    c.submit("r2", 60_000)
    return c


def test_likely_and_latest_start() -> None:
    c = cluster(timeout=300)
    before = fingerprint(c.state)
    found = estimate(c.state, c.read_model, "r2", now=70_000)
    assert found is not None
    assert found["likelyStartAt"] == 90_000  # r1 ends at 50 s + the 40 s median
    assert found["latestStartAt"] == 350_000  # r1 ends at its timeout at the latest
    assert any("QS3" in line and "40.0" in line for line in found["assumptions"])
    assert fingerprint(c.state) == before  # the scheduler's own state is untouched


def test_without_timeouts_there_is_no_latest_start() -> None:
    c = cluster(timeout=None)
    found = estimate(c.state, c.read_model, "r2", now=100_000)
    assert found is not None
    assert found["likelyStartAt"] == 100_000  # r1 outran the median: assumed to end now
    assert found["latestStartAt"] is None
    assert any("no bound" in line for line in found["assumptions"])


def test_only_waiting_jobs_get_an_estimate() -> None:
    c = cluster(timeout=None)
    assert estimate(c.state, c.read_model, "r1", now=70_000) is None
    explainer = EstimatingExplainer(lambda: c.state, c.read_model, lambda: 70_000)
    running, waiting = explainer("r1"), explainer("r2")
    assert running is not None and running.estimate is None
    assert waiting is not None and waiting.estimate is not None
    assert waiting.reason == "WAITING_FOR_OWN_QUOTA"


def test_gpuquota_explain_shows_the_estimate(capsys: Any) -> None:
    from tests.cli.conftest import Cli, play_worked_example
    from tests.gateway.conftest import StackThread

    stack = StackThread()
    try:
        jobs = play_worked_example(stack)
        cli = Cli(capsys, stack.stack.url)
        low = cli("explain", jobs["qs1_job_low"])
        assert low.rc == 0, low.err
        assert "Start estimate" in low.out
        assert "  latest     no bound" in low.out  # the running jobs have no timeout
        assert "  likely     " in low.out and "assuming no new submissions" in low.out
        import json

        data = json.loads(cli("explain", jobs["qs1_job_low"], "-o", "json").out)
        found = data["explanation"]["startEstimate"]
        assert found["likelyStartAt"] >= found["estimatedAt"] and found["latestStartAt"] is None
        running = json.loads(cli("explain", jobs["qs1_job_high"], "-o", "json").out)
        assert running["explanation"]["startEstimate"] is None
    finally:
        stack.close()


def test_an_estimate_out_of_time_says_how_far_it_got() -> None:
    from gpuquota.sim.estimate import likely_end, trial_sweep

    c = cluster(timeout=300)
    before = fingerprint(c.state)
    cut = trial_sweep(c.state, 70_000, likely_end({}), budget_s=0.0)
    assert "r2" not in cut.starts and cut.not_before == 70_000
    assert fingerprint(c.state) == before


def test_a_failing_estimate_leaves_the_explanation(monkeypatch: Any) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("bug")

    from gpuquota.sim.background import BackgroundEstimator

    monkeypatch.setattr(BackgroundEstimator, "estimate", broken)
    c = cluster(timeout=None)
    found = EstimatingExplainer(lambda: c.state, c.read_model, lambda: 70_000)("r2")
    assert found is not None and found.reason == "WAITING_FOR_OWN_QUOTA" and found.estimate is None


def deep_queue() -> tuple[Cluster, dict[tuple[str, int], list[str]]]:
    """303 jobs in three shares, two priorities; the first three run (10 min timeouts)."""
    c = Cluster()
    order: dict[tuple[str, int], list[str]] = {}
    for index in range(303):
        share, priority = ("QS1", "QS2", "QS3")[index % 3], (index // 3) % 2
        name = f"j{index:03d}"
        job = JobSpec(
            job_id=name,
            job_name=name,
            job_queue=QUEUE,
            quota_share=share,
            priority=priority,
            unit="ml.g5.xlarge",
            created_at=index,
            attempt_duration_seconds=600,
        )
        c.feed(inp.SubmitJob, index, job=job)
        if index >= 3:  # the first three run
            order.setdefault((share, priority), []).append(name)
    return c, order


def test_one_sweep_answers_for_a_deep_queue_consistently(monkeypatch: Any) -> None:
    """300 jobs wait in three shares; the deepest gets a start, and within a share and priority the
    starts follow the queue's order. Every job of one state version comes from the same sweeps."""
    import gpuquota.sim.estimate as module

    monkeypatch.setattr(module, "LIKELY_BUDGET_S", 60.0)  # no time budget: the answer, not the speed
    monkeypatch.setattr(module, "BUDGET_S", 120.0)
    c, order = deep_queue()
    estimator = module.Estimator()
    before = fingerprint(c.state)
    answers = {
        name: estimator.estimate(c.state, c.read_model, name, 1_000)
        for names in order.values()
        for name in names
    }
    assert fingerprint(c.state) == before
    sweeps = estimator.sweeps
    assert sweeps is not None and sweeps.estimated_at == 1_000
    for (share, priority), names in order.items():
        likely = [answers[n]["likelyStartAt"] for n in names]  # type: ignore[index]
        latest = [answers[n]["latestStartAt"] for n in names]  # type: ignore[index]
        assert None not in likely and None not in latest, (share, priority)
        assert likely == sorted(likely) and latest == sorted(latest), (share, priority)
    deepest = order[("QS3", 0)][-1]
    assert answers[deepest]["latestStartAt"] >= 600_000  # type: ignore[index]
    # the same state version: a look-up; a new event: new sweeps
    assert estimator.estimate(c.state, c.read_model, deepest, 2_000) == answers[deepest]
    c.succeed("j000", 2_000)
    assert estimator.estimate(c.state, c.read_model, deepest, 2_000) is not None
    assert estimator.sweeps is not sweeps


def test_the_background_sweeps_answer_as_the_synchronous_ones(monkeypatch: Any) -> None:
    """The gateway's estimator sweeps a copy in a thread: once it is done, every waiting job's answer
    is the one the sweeps on the scheduler's own state (in a trial) give, and the state is untouched."""
    import gpuquota.sim.estimate as module
    from gpuquota.sim.background import BackgroundEstimator

    monkeypatch.setattr(module, "LIKELY_BUDGET_S", 60.0)
    monkeypatch.setattr(module, "BUDGET_S", 120.0)
    c, order = deep_queue()
    names = [name for group in order.values() for name in group]
    before = fingerprint(c.state)
    background = BackgroundEstimator()
    first = background.estimate(c.state, c.read_model, names[-1], 1_000)
    run = background.current
    assert first is not None and run is not None
    with background.changed:
        background.changed.wait_for(lambda: run.over, timeout=60)
    assert run.over and not run.failed
    synchronous = module.Estimator()
    for name in names:
        assert background.estimate(c.state, c.read_model, name, 1_000) == synchronous.estimate(
            c.state, c.read_model, name, 1_000
        ), name
    assert fingerprint(c.state) == before


def test_while_the_sweeps_rest_the_last_ones_answer_and_say_how_old(monkeypatch: Any) -> None:
    from gpuquota.sim import background

    c = cluster(timeout=300)
    estimator = background.BackgroundEstimator()
    assert estimator.estimate(c.state, c.read_model, "r2", 70_000) is not None
    run = estimator.current
    assert run is not None
    with estimator.changed:
        estimator.changed.wait_for(lambda: run.over, timeout=60)
    monkeypatch.setattr(background, "_resting", lambda _: True)
    c.submit("r3", 71_000)  # a new state version
    found = estimator.estimate(c.state, c.read_model, "r2", 72_000)
    assert estimator.current is run and found is not None
    assert found["likelyStartAt"] == 90_000 and found["estimatedAt"] == 70_000
    assert found["assumptions"][-1].startswith("estimated from the state 1 event(s) ago")
    # a job the resting sweeps never saw gets the synchronous estimate
    newer = estimator.estimate(c.state, c.read_model, "r3", 72_000)
    assert newer is not None and newer["estimatedAt"] == 72_000
