"""``GET /metrics`` (I7) after the worked example's two first steps, and after a restart from the log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from gpuquota.observe.metrics import METRICS
from gpuquota.read.jobs import JobView
from gpuquota.read.tally import EventTally, failure_class
from gpuquota.wire import events as ev
from tests.builders import job
from tests.gateway.conftest import StackThread, batch_client
from tests.gateway.helpers import G5
from tests.observe.helpers import scrape, stack, two_steps, value

SHARE = {"queue": "jq", "unit": G5}
DOCS = Path(__file__).parents[2] / "docs" / "operations.md"


def test_the_worked_example_in_the_share_gauges_and_counters(tmp_path: Path) -> None:
    running = stack(data_dir=tmp_path)
    try:
        ids = two_steps(running.client)
        samples = scrape(running.url)
    finally:
        running.close()
    figures = {
        # share: limit, maximum, used, borrowed, queued, running, reserved idle
        "QS1": (1, 3, 1, 0, 2, 1, 0),
        "QS2": (1, 1, 1, 0, 0, 1, 0),
        "QS3": (1, 1, 0, 0, 0, 0, 1),
    }
    names = (
        *("limit_instances", "maximum_instances", "used_instances", "borrowed_instances", "queued_jobs"),
        *("running_jobs", "reserved_idle_instances"),
    )
    for share, expected in figures.items():
        got = tuple(value(samples, f"gpuquota_share_{n}", share=share, **SHARE) for n in names)
        assert got == expected, share
    assert value(samples, "gpuquota_pool_capacity_slots", pool="default", unit=G5) == 3
    assert value(samples, "gpuquota_pool_free_slots", pool="default", unit=G5) == 1
    assert value(samples, "gpuquota_node_gpus", pool="default", node="local-1", unit=G5) == 3
    assert value(samples, "gpuquota_node_up", pool="default", node="local-1") == 1
    assert value(samples, "gpuquota_jobs_submitted_total", queue="jq", share="QS1") == 3
    assert value(samples, "gpuquota_preemptions_total", kind="CROSS_SHARE") == 1
    # med ran before QS2's job reclaimed its instance: that work is lost
    lost = value(samples, "gpuquota_preempted_gpu_seconds_total", queue="jq", share="QS1", kind="CROSS_SHARE")
    assert lost > 0
    assert value(samples, "gpuquota_dispatches_total", phase="BORROW") == 1
    assert value(samples, "gpuquota_submit_to_start_seconds_count") == 3  # high, med, qs2 started
    assert value(samples, "gpuquota_scheduling_step_seconds_count") > 0
    assert value(samples, "gpuquota_log_append_batch_size_count") > 0
    labels = {v for (_, pairs) in samples for _, v in pairs}
    assert not labels & set(ids.values()), "a job id is a label value: unbounded cardinality"


def test_counters_are_rebuilt_from_the_log_after_a_restart(tmp_path: Path) -> None:
    # leave_running: a stack that stops its jobs on close would dispatch them again while it stops,
    # after the scrape (the counters compared must be the log's as scraped)
    first = stack(data_dir=tmp_path, leave_running=True)
    try:
        two_steps(first.client)
        before = scrape(first.url)
    except BaseException:
        first.close()
        raise
    first.close()
    # the same log without its node: a simulated attempt is not adopted, and nothing may be dispatched
    # again between the restart and the scrape (the counters compared are the log's, not new work)
    second = StackThread(**{**first.options, "nodes": ""})
    try:
        after = scrape(second.url)
    finally:
        second.close()
    for name in (
        "gpuquota_jobs_submitted_total",
        "gpuquota_preemptions_total",
        "gpuquota_preempted_gpu_seconds_total",
        "gpuquota_dispatches_total",
    ):
        assert {k: v for k, v in before.items() if k[0] == name} == {
            k: v for k, v in after.items() if k[0] == name
        }


def test_preempted_gpu_seconds_are_runtime_times_instances_per_share_and_kind() -> None:
    def preempted(victim: JobView, kind: ev.PreemptionKind, runtime_ms: int) -> ev.JobPreempted:
        figures = ev.PreemptionFigures(
            unit=G5,
            preemptor_demand=1,
            pool_capacity=3,
            pool_usage=3,
            reserved_idle=0,
            held=0,
            preemptor_share_usage=0,
            preemptor_share_limit=1,
            victim_share_usage=2,
            victim_share_limit=1,
        )
        return ev.JobPreempted(
            event_id="e",
            occurred_at=0,
            job_id=victim.spec.job_id,
            attempt_id=f"{victim.spec.job_id}/1",
            preemptor_job_id="p",
            preemptor_share="QS2",
            victim_share=victim.spec.quota_share,
            kind=kind,
            status_reason="reclaimed",
            figures=figures,
            victim_runtime_ms=runtime_ms,
        )

    gang = JobView(job("gang").share("QS1").needs(2).build(created_at=0))
    single = JobView(job("single").share("QS1").build(created_at=0))
    tally = EventTally()
    tally.observe(preempted(gang, "CROSS_SHARE", 90_000), gang)  # 2 instances x 90 s
    tally.observe(preempted(single, "CROSS_SHARE", 1_500), single)
    tally.observe(preempted(single, "IN_SHARE", 4_000), single)
    tally.observe(preempted(single, "IN_SHARE", 0), single)  # not started yet: nothing lost
    (family,) = [m for m in tally.collect() if m.name == "gpuquota_preempted_gpu_seconds"]
    got = {(s.labels["share"], s.labels["kind"]): s.value for s in family.samples}
    assert got == {("QS1", "CROSS_SHARE"): 181.5, ("QS1", "IN_SHARE"): 4.0}
    assert all(set(s.labels) == {"queue", "share", "kind"} for s in family.samples)


def test_failures_are_classified_without_their_text() -> None:
    def failed(reason: str, **flags: bool) -> ev.JobFailed:
        return ev.JobFailed(event_id="e", occurred_at=0, job_id="j", status_reason=reason, **flags)

    assert failure_class(failed("Essential container exited with code 3")) == "error"
    assert failure_class(failed("Attempt duration exceeded")) == "timeout"
    assert failure_class(failed("by user", is_terminated=True)) == "terminated"
    assert failure_class(failed("preempted too often", preempted=True)) == "preempted"


def test_every_metric_is_in_the_operations_table() -> None:
    documented = set(re.findall(r"^\| `(gpuquota_[a-z_]+)`", DOCS.read_text(), re.MULTILINE))
    exposed = {name + ("_total" if kind == "counter" else "") for name, (kind, _, _) in METRICS.items()}
    assert exposed == documented


def _up(data_dir: Path, log: Path) -> tuple[subprocess.Popen[str], str]:
    """``gpuquota up`` (simulated runtime) on a free port; the process and its URL once ready."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    with log.open("a") as stderr:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuquota",
                "up",
                "--data-dir",
                str(data_dir),
                "--runtime",
                "simulated",
                "--leave-running",  # the counters are the log's: no stop-and-requeue on the way out
            ],
            env={**env, "GPUQUOTA_PORT": "0"},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("gpuquota ready on "), log.read_text()[-3000:]
    return proc, line.rsplit(" ", 1)[1]


def _end(proc: subprocess.Popen[str], how: signal.Signals) -> None:
    proc.send_signal(how)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()


def test_counters_survive_a_sigkill_of_gpuquota_up(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    proc, url = _up(tmp_path / "data", log)
    try:
        two_steps(batch_client(url))
        before = scrape(url)
    finally:
        _end(proc, signal.SIGKILL)  # nothing flushed, nothing closed
    proc, url = _up(tmp_path / "data", log)
    try:
        after = scrape(url)
    finally:
        _end(proc, signal.SIGTERM)
    for name, labels in (
        ("gpuquota_jobs_submitted_total", {"queue": "jq", "share": "QS1"}),
        ("gpuquota_jobs_submitted_total", {"queue": "jq", "share": "QS2"}),
        ("gpuquota_preemptions_total", {"kind": "CROSS_SHARE"}),
        ("gpuquota_preempted_gpu_seconds_total", {"queue": "jq", "share": "QS1", "kind": "CROSS_SHARE"}),
        ("gpuquota_share_limit_instances", {"share": "QS3", **SHARE}),
    ):
        assert value(after, name, **labels) == value(before, name, **labels), name
