"""``GET /metrics`` (I7) after the worked example's two first steps, and after a restart from the log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from gpuquota.observe.metrics import METRICS, failure_class
from gpuquota.wire import events as ev
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
    assert value(samples, "gpuquota_dispatches_total", phase="BORROW") == 1
    assert value(samples, "gpuquota_submit_to_start_seconds_count") == 3  # high, med, qs2 started
    assert value(samples, "gpuquota_scheduling_step_seconds_count") > 0
    assert value(samples, "gpuquota_log_append_batch_size_count") > 0
    labels = {v for (_, pairs) in samples for _, v in pairs}
    assert not labels & set(ids.values()), "a job id is a label value: unbounded cardinality"


def test_counters_are_rebuilt_from_the_log_after_a_restart(tmp_path: Path) -> None:
    first = stack(data_dir=tmp_path)
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
    for name in ("gpuquota_jobs_submitted_total", "gpuquota_preemptions_total", "gpuquota_dispatches_total"):
        assert {k: v for k, v in before.items() if k[0] == name} == {
            k: v for k, v in after.items() if k[0] == name
        }


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
        ("gpuquota_share_limit_instances", {"share": "QS3", **SHARE}),
    ):
        assert value(after, name, **labels) == value(before, name, **labels), name
