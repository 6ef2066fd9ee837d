"""``gpuquota apply -f FILE.yaml``: create, update, unchanged; dry runs; clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuquota.ctl.apply_doc import parse
from gpuquota.ctl.demo_scenario import WORKED_EXAMPLE
from tests.cli.conftest import Cli
from tests.gateway.conftest import StackThread

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "worked-example.yaml"
G5 = "ml.g5.xlarge"
QUEUE = "my-sm-training-qm-jq"


def actions(out: str) -> dict[str, str]:
    """NAME -> ACTION from apply's table (the last line is the summary; a dry run's impact follows
    after a blank line)."""
    rows = [line.split() for line in out.strip().split("\n\n")[0].splitlines()[1:-1]]
    return {row[2] if row[0] in ("scheduling", "service", "job", "quota") else row[1]: row[3] for row in rows}


def test_the_example_file_is_the_demos_setup() -> None:
    assert parse(yaml.safe_load(EXAMPLE.read_text())) == parse(WORKED_EXAMPLE)


def test_apply_creates_then_is_idempotent(stack: StackThread, cli: Cli) -> None:
    first = cli("apply", "-f", str(EXAMPLE))
    assert first.rc == 0, first.err
    assert actions(first.out) == {
        "my-qm-scheduling-policy": "created",
        "my-sm-training-qm-se": "created",
        QUEUE: "created",
        f"{QUEUE}/QS1": "created",
        f"{QUEUE}/QS2": "created",
        f"{QUEUE}/QS3": "created",
    }
    assert first.out.strip().endswith("6 created")
    batch: Any = stack.client
    shares = {s["quotaShareName"]: s for s in batch.list_quota_shares(jobQueue=QUEUE)["quotaShares"]}
    assert shares["QS1"]["resourceSharingConfiguration"] == {
        "strategy": "LEND_AND_BORROW",
        "borrowLimit": 200,
    }
    assert shares["QS1"]["preemptionConfiguration"] == {"inSharePreemption": "ENABLED"}
    assert shares["QS3"]["resourceSharingConfiguration"] == {"strategy": "RESERVE"}
    assert shares["QS2"]["capacityLimits"] == [{"maxCapacity": 1, "capacityUnit": G5}]

    second = cli("apply", "-f", str(EXAMPLE), "-o", "json")
    assert second.rc == 0
    changes = json.loads(second.out)["changes"]
    assert [c["action"] for c in changes] == ["unchanged"] * 6
    assert all(c["changes"] == [] for c in changes)


def test_apply_updates_only_what_differs(stack: StackThread, cli: Cli, tmp_path: Path) -> None:
    assert cli("apply", "-f", str(EXAMPLE)).rc == 0
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["serviceEnvironment"]["capacityLimits"][G5] = 4
    doc["jobQueue"]["priority"] = 5
    doc["jobQueue"]["tags"] = {"team": "ml"}
    doc["quotaShares"][0]["borrowLimit"] = -1
    doc["quotaShares"][1]["inSharePreemption"] = True  # YAML booleans mean ENABLED / DISABLED
    doc["quotaShares"][2]["capacityLimits"][G5] = 2
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(doc))

    dry = cli("apply", "-f", str(changed), "--dry-run")
    assert dry.rc == 0
    assert actions(dry.out)["my-sm-training-qm-se"] == "would"
    batch: Any = stack.client
    assert batch.describe_job_queues(jobQueues=[QUEUE])["jobQueues"][0]["priority"] == 1

    result = cli("apply", "-f", str(changed), "-o", "json")
    assert result.rc == 0, result.err
    by_name = {c["name"]: c for c in json.loads(result.out)["changes"]}
    assert by_name["my-qm-scheduling-policy"]["action"] == "unchanged"
    assert by_name["my-sm-training-qm-se"]["changes"] == [f"capacityLimits[{G5}]: 3 -> 4"]
    assert by_name[QUEUE]["changes"] == ["priority: 1 -> 5", "tags[team]: - -> ml"]
    assert by_name[f"{QUEUE}/QS1"]["changes"] == ["borrowLimit: 200 -> -1"]
    assert by_name[f"{QUEUE}/QS2"]["changes"] == ["inSharePreemption: DISABLED -> ENABLED"]
    assert by_name[f"{QUEUE}/QS3"]["changes"] == [f"capacityLimits[{G5}]: 1 -> 2"]
    assert all(c["action"] == "updated" for n, c in by_name.items() if n != "my-qm-scheduling-policy")

    queue = batch.describe_job_queues(jobQueues=[QUEUE])["jobQueues"][0]
    assert (queue["priority"], queue["tags"]) == (5, {"team": "ml"})
    environment = batch.describe_service_environments(serviceEnvironments=["my-sm-training-qm-se"])
    assert environment["serviceEnvironments"][0]["capacityLimits"] == [{"maxCapacity": 4, "capacityUnit": G5}]
    again = json.loads(cli("apply", "-f", str(changed), "-o", "json").out)["changes"]
    assert {c["action"] for c in again} == {"unchanged"}


def test_apply_shares_into_an_existing_queue(stack: StackThread, cli: Cli, tmp_path: Path) -> None:
    assert cli("apply", "-f", str(EXAMPLE)).rc == 0
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        f"quotaShares:\n  - name: QS4\n    jobQueue: {QUEUE}\n    capacityLimits: {{{G5}: 1}}\n"
        "    strategy: LEND\n"
    )
    result = cli("apply", "-f", str(extra))
    assert result.rc == 0, result.err
    assert actions(result.out) == {f"{QUEUE}/QS4": "created"}
    missing = tmp_path / "missing.yaml"
    missing.write_text(extra.read_text().replace(QUEUE, "nope"))
    failed = cli("apply", "-f", str(missing))
    assert (failed.rc, failed.err) == (1, "gpuquota apply: Job queue nope does not exist\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "jobQueue: [\n",
            "invalid YAML at line 2, column 1: expected the node content, but found '<stream end>'",
        ),
        ("", "the file is empty"),
        ("- a\n- b\n", "expected a mapping with schedulingPolicy, serviceEnvironment, ..."),
        (
            "schedulingPolicy: {name: p}\nfoo: 1\n",
            "unknown key foo (expected one of: schedulingPolicy, serviceEnvironment, jobQueue, quotaShares, "
            "trainingPlans)",
        ),
        (
            "jobQueue: {name: q, priorty: 1, schedulingPolicy: p, serviceEnvironment: s}\n",
            "unknown key jobQueue.priorty (expected one of: name, priority, state, schedulingPolicy, "
            "serviceEnvironment, tags)",
        ),
        (
            "quotaShares:\n  - {name: A, jobQueue: q, capacityLimits: {g: 1}, strategy: LEND,\n"
            "     borrowLimit: 5}\n",
            "quotaShares[0]: borrowLimit can only be applied to quota shares with a strategy of "
            "LEND_AND_BORROW",
        ),
        (
            "quotaShares:\n  - {name: A, jobQueue: q, capacityLimits: {g: 1}, strategy: BORROW}\n",
            "quotaShares[0].strategy: Input should be 'RESERVE', 'LEND' or 'LEND_AND_BORROW'",
        ),
        (
            "quotaShares:\n  - {name: A, jobQueue: q, capacityLimits: {g: 0}, strategy: LEND}\n",
            "quotaShares[0]: capacityLimits[0].maxCapacity must be at least 1, got 0",
        ),
        (
            "quotaShares:\n  - {name: A, capacityLimits: {g: 1}, strategy: LEND}\n",
            "quotaShares[0].jobQueue is required when the file has no jobQueue",
        ),
        ("serviceEnvironment: {name: s}\n", "missing required key serviceEnvironment.capacityLimits"),
        (
            "jobQueue: {name: q}\n",
            "jobQueue.schedulingPolicy is required when the file has no schedulingPolicy",
        ),
    ],
)
def test_bad_files_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    from gpuquota.entrypoints.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    # No server needed: the file is checked before anything is sent.
    assert main(["apply", "-f", str(path), "--endpoint", "http://127.0.0.1:1"]) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"gpuquota apply: {path}: {message}\n")


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuquota.entrypoints.cli import main

    assert main(["apply", "-f", str(tmp_path / "nope.yaml")]) == 1
    assert (
        capsys.readouterr().err
        == f"gpuquota apply: cannot read {tmp_path / 'nope.yaml'}: No such file or directory\n"
    )
