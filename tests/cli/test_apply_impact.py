"""``gpuquota apply -f FILE --dry-run`` on a running stack: what the change would do to the jobs.

The stack is what ``gpuquota up`` runs (embedded scheduler, gateway, a local ``process`` node agent
with 3 instances); its jobs are real processes that sleep for an hour. Each test dry-runs a change
and checks the impact it shows, then that nothing was applied: the quota shares describe as before
and every job still runs its first attempt.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.ctl.api import poll
from tests.cli.conftest import Cli
from tests.gateway.conftest import StackThread
from tests.gateway.helpers import payload, share_arn, submit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "deploy" / "examples" / "worked-example.yaml").read_text())
QUEUE = EXAMPLE["jobQueue"]["name"]
G5 = "ml.g5.xlarge"
SLEEPER = payload(
    AlgorithmSpecification={"ContainerEntrypoint": [sys.executable, "-c", "import time; time.sleep(3600)"]}
)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[StackThread]:
    s = StackThread(data_dir=tmp_path / "data", nodes=f"{G5}=3", runtime="process", tick_seconds=0.2)
    try:
        yield s
    finally:
        s.close()


def write(tmp_path: Path, name: str, doc: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def start(stack: StackThread, name: str, share: str, priority: int = 0) -> str:
    """Submit a job that sleeps an hour; once it runs, its id."""
    job_id = submit(stack.client, name, share, priority, jobQueue=QUEUE, serviceRequestPayload=SLEEPER)
    running = poll(lambda: status(stack, job_id) == "RUNNING" or None, time.monotonic() + 30)
    assert running, f"{name} is {status(stack, job_id)}"
    return job_id


def queue(stack: StackThread, name: str, share: str) -> str:
    job_id = submit(stack.client, name, share, jobQueue=QUEUE, serviceRequestPayload=SLEEPER)
    assert status(stack, job_id) == "RUNNABLE"
    return job_id


def status(stack: StackThread, job_id: str) -> str:
    return str(stack.client.describe_service_job(jobId=job_id)["status"])


def described(stack: StackThread, doc: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name in (share["name"] for share in doc["quotaShares"]):
        found = stack.client.describe_quota_share(quotaShareArn=share_arn(name, QUEUE))
        found.pop("ResponseMetadata", None)
        out[name] = found
    return out


def first_attempts(stack: StackThread, job_ids: list[str]) -> dict[str, tuple[str, int]]:
    jobs = [stack.client.describe_service_job(jobId=j) for j in job_ids]
    return {j["jobName"]: (j["status"], len(j.get("attempts", []))) for j in jobs}


def impact_of(cli: Cli, file: str) -> tuple[dict[str, Any], str]:
    """The dry run's impact (``-o json``) and its table."""
    as_json = cli("apply", "-f", file, "--dry-run", "-o", "json")
    assert as_json.rc == 0, as_json.err
    text = cli("apply", "-f", file, "--dry-run")
    assert text.rc == 0, text.err
    return json.loads(as_json.out)["impact"], text.out


def names(rows: list[dict[str, Any]]) -> list[str]:
    return [row["jobName"] for row in rows]


def share_row(impact: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in impact["shares"] if r["quotaShareName"] == name)


def test_dry_run_of_lowering_a_limit(
    up: StackThread, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """QS1 (limit 2) runs low (priority 1) and high (priority 5); QS2 (limit 2) runs b1, and b2 waits
    in its quota with nobody borrowing. Lowering QS1 to 1 makes it borrow: b2 would reclaim at once,
    lowest priority first."""
    cli = Cli(capsys, up.url)
    setup = copy.deepcopy(EXAMPLE)
    del setup["quotaShares"][2]  # no RESERVE share: QS2's waiting job is all that claims capacity
    setup["quotaShares"][0]["capacityLimits"][G5] = 2
    setup["quotaShares"][1]["capacityLimits"][G5] = 2
    assert cli("apply", "-f", write(tmp_path, "setup.yaml", setup)).rc == 0
    running = [start(up, "low", "QS1", 1), start(up, "high", "QS1", 5), start(up, "b1", "QS2")]
    waiting = queue(up, "b2", "QS2")
    before = described(up, setup)

    change = copy.deepcopy(setup)
    change["quotaShares"][0]["capacityLimits"][G5] = 1
    impact, text = impact_of(cli, write(tmp_path, "lower.yaml", change))

    assert names(impact["preempted_now"]) == ["low"]
    assert impact["preempted_now"][0]["kind"] == "CROSS_SHARE"
    (moved,) = impact["start_changes"]
    assert (moved["jobName"], moved["after"]) == ("b2", impact["at"])
    assert moved["before"] is None or moved["before"] > moved["after"]
    qs1 = share_row(impact, "QS1")
    assert (qs1["before"]["limits"], qs1["after"]["limits"]) == ({G5: 2}, {G5: 1})
    assert (qs1["before"]["borrowed"], qs1["after"]["borrowed"]) == ({G5: 0}, {G5: 1})
    assert "Stopped at once" in text and "low" in text and "2 -> 1" in text

    assert described(up, setup) == before
    assert first_attempts(up, [*running, waiting]) == {
        "low": ("RUNNING", 1),
        "high": ("RUNNING", 1),
        "b1": ("RUNNING", 1),
        "b2": ("RUNNABLE", 0),
    }


def test_dry_run_of_lend_to_reserve(
    up: StackThread, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """S8's shares: QS1 runs q1 in its quota and q2 on QS2's lent instance; q3 waits. With QS2
    RESERVE its instance is no longer lent: q3 cannot borrow when q1 ends, so it starts later."""
    cli = Cli(capsys, up.url)
    assert cli("apply", "-f", write(tmp_path, "setup.yaml", EXAMPLE)).rc == 0
    running = [start(up, "q1", "QS1"), start(up, "q2", "QS1")]
    waiting = queue(up, "q3", "QS1")
    before = described(up, EXAMPLE)

    change = copy.deepcopy(EXAMPLE)
    change["quotaShares"][1]["strategy"] = "RESERVE"
    impact, text = impact_of(cli, write(tmp_path, "reserve.yaml", change))

    qs2 = share_row(impact, "QS2")
    assert (qs2["before"]["strategy"], qs2["after"]["strategy"]) == ("LEND", "RESERVE")
    assert (qs2["before"]["lent"], qs2["after"]["lent"]) == ({G5: 1}, {G5: 0})
    assert (qs2["before"]["reserved"], qs2["after"]["reserved"]) == ({G5: 0}, {G5: 1})
    assert share_row(impact, "QS1")["after"]["borrowed"] == {G5: 1}
    assert impact["preempted_now"] == [] and impact["becomes_borrowing"] == []
    (moved,) = impact["start_changes"]
    assert moved["jobName"] == "q3" and moved["after"] > moved["before"]
    assert "LEND -> RESERVE" in text and "Likely starts that move" in text

    assert described(up, EXAMPLE) == before
    assert first_attempts(up, [*running, waiting]) == {
        "q1": ("RUNNING", 1),
        "q2": ("RUNNING", 1),
        "q3": ("RUNNABLE", 0),
    }
