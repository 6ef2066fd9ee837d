"""The gateway keeps the start estimates' sweeps ahead of the questions (``gpuquota.sim.explainer``):
a new state version starts a run without a question, and an answer from the run of an older version
says how old it is."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import gpuquota.sim.estimate as estimate_module
from gpuquota.sim import background
from gpuquota.sim.explainer import EstimatingExplainer
from tests.sim.test_estimate import cluster


def finished(estimator: background.BackgroundEstimator) -> background.Run:
    run = estimator.current
    assert run is not None
    with estimator.changed:
        estimator.changed.wait_for(lambda: run.over, timeout=60)
    assert run.over and not run.failed
    return run


def test_a_finished_run_of_an_older_version_answers_with_its_age(monkeypatch: Any) -> None:
    c = cluster(timeout=300)
    estimator = background.BackgroundEstimator()
    estimator.refresh(c.state, c.read_model, 70_000)  # no question yet: the run starts anyway
    old = finished(estimator)
    assert old.version == (id(c.state), c.state.applied)
    estimator.refresh(c.state, c.read_model, 70_500)
    assert estimator.current is old  # the same version: nothing to redo
    # the next run stays in flight until released
    release = threading.Event()
    monkeypatch.setattr(background.BackgroundEstimator, "_sweep", lambda *_: release.wait(60))
    monkeypatch.setattr(background, "_resting", lambda _: False)
    c.submit("r3", 71_000)  # a new state version
    estimator.refresh(c.state, c.read_model, 71_000)
    assert estimator.current is not old and estimator.current is not None
    try:
        found = estimator.estimate(c.state, c.read_model, "r2", 73_000)
    finally:
        release.set()
    assert found is not None
    assert found["likelyStartAt"] == 90_000 and found["estimatedAt"] == 70_000
    assert found["likelyNotBefore"] is None and found["latestNotBefore"] is None  # complete
    assert found["assumptions"][-1] == (
        "estimated from the state 1 event(s) ago (3.0 s ago; a newer estimate is running)"
    )


def test_the_explainer_keeps_the_sweeps_ahead_once_asked() -> None:
    c = cluster(timeout=300)
    now = [70_000]
    explainer = EstimatingExplainer(lambda: c.state, c.read_model, lambda: now[0])
    explainer.refresh()
    assert explainer.estimator.current is None  # nobody has asked: no sweep

    async def scenario() -> None:
        explainer.start()
        try:
            first = explainer("r2")
            assert first is not None and first.estimate is not None
            c.submit("r3", 71_000)  # nobody asks about it: the task sweeps it all the same
            now[0] = 71_000
            wanted = (id(c.state), c.state.applied)
            for _ in range(600):
                run = explainer.estimator.finished
                if run is not None and run.version == wanted:
                    break
                await asyncio.sleep(0.05)
            run = explainer.estimator.finished
            assert run is not None and run.version == wanted and "r3" in run.likely
        finally:
            await explainer.stop()
        assert explainer.task is None

    asyncio.run(scenario())


def test_a_failed_run_is_not_retried_at_once(monkeypatch: Any) -> None:
    """A failing sweep is logged and answered around, but the refresh task does not redo it every
    half second: the next version waits ``FAILED_REST_S``."""
    c = cluster(timeout=300)
    estimator = background.BackgroundEstimator()

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(estimate_module, "sweep", broken)
    estimator.refresh(c.state, c.read_model, 70_000)
    failed = finished_or_failed(estimator)
    assert failed.failed and failed.ended_s is not None
    failed.began_s = failed.ended_s  # it took no time: only the failure's rest applies
    estimator.refresh(c.state, c.read_model, 70_500)  # the same version: not again
    c.submit("r3", 71_000)
    estimator.refresh(c.state, c.read_model, 71_000)  # a new one: after the rest
    assert estimator.current is failed
    found = estimator.estimate(c.state, c.read_model, "r2", 71_000)
    assert found is not None and found["likelyStartAt"] is None  # "after": no sweep got there
    monkeypatch.setattr(background, "FAILED_REST_S", 0.0)
    estimator.refresh(c.state, c.read_model, 71_000)
    assert estimator.current is not failed


def finished_or_failed(estimator: background.BackgroundEstimator) -> background.Run:
    run = estimator.current
    assert run is not None
    with estimator.changed:
        estimator.changed.wait_for(lambda: run.over, timeout=60)
    assert run.over
    return run
