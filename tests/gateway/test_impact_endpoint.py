"""``POST /gpuquota/v1/impact`` (``apply --dry-run``) in both modes: the impact of writes that are
checked as the real operations check them and never sent; admin keys only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuquota.ctl.api import Api, CliError
from gpuquota.gateway.auth import Keyring
from tests.gateway.conftest import Stack
from tests.gateway.helpers import G5, create_queue, create_share, share_arn, status, submit, worked_example

LOWER_QS1 = {"quotaShareArn": share_arn("QS1"), "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}]}


def running(stack: Stack, name: str, share: str, priority: int = 0) -> str:
    job_id = submit(stack.client, name, share, priority)
    stack.report(job_id, "STARTING")
    stack.report(job_id, "RUNNING")
    return job_id


def describe(stack: Stack, *names: str) -> list[dict[str, Any]]:
    found = [stack.client.describe_quota_share(quotaShareArn=share_arn(n)) for n in names]
    for item in found:
        item.pop("ResponseMetadata", None)
    return found


def test_lowering_a_limit_in_a_dry_run(stack: Stack) -> None:
    """QS1 (limit 2) runs two jobs, QS2 (limit 2) one, and its second waits; lowering QS1 to 1 makes
    QS1 borrow and QS2's waiting job reclaims QS1's lower-priority job at once, in the impact only."""
    batch: Any = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND_AND_BORROW", limit=2, borrow=-1)
    create_share(batch, "QS2", "LEND", limit=2)
    stack.register_node(count=3)
    low, high = running(stack, "low", "QS1", 1), running(stack, "high", "QS1", 5)
    b1 = running(stack, "b1", "QS2")
    b2 = submit(batch, "b2", "QS2")
    assert status(batch, b2) == "RUNNABLE"
    before = describe(stack, "QS1", "QS2")

    impact = Api(stack.url).impact([{"operation": "UpdateQuotaShare", "request": LOWER_QS1}])

    assert [r["job"] for r in impact["preempted_now"]] == [low]
    assert [r["job"] for r in impact["start_changes"]] == [b2]
    assert impact["start_changes"][0]["after"] == impact["at"]
    qs1 = next(r for r in impact["shares"] if r["quotaShareName"] == "QS1")
    assert (qs1["before"]["limits"], qs1["after"]["limits"]) == ({G5: 2}, {G5: 1})
    assert describe(stack, "QS1", "QS2") == before
    assert [status(batch, j) for j in (low, high, b1, b2)] == ["RUNNING", "RUNNING", "RUNNING", "RUNNABLE"]


@pytest.mark.parametrize(
    ("operation", "message"),
    [
        ({"operation": "SubmitServiceJob", "request": {}}, "operations[0].operation must be one of"),
        (
            {"operation": "UpdateQuotaShare", "request": {**LOWER_QS1, "capacityLimits": []}},
            "operations[0] (UpdateQuotaShare): A quota share must have between 1 and 5 capacity limits",
        ),
        (
            {"operation": "UpdateQuotaShare", "request": {**LOWER_QS1, "quotaShareArn": share_arn("QSX")}},
            "operations[0] (UpdateQuotaShare): Quota share",
        ),
    ],
)
def test_bad_operations_are_client_errors(stack: Stack, operation: dict[str, Any], message: str) -> None:
    worked_example(stack.client)
    with pytest.raises(CliError) as info:
        Api(stack.url).impact([operation])
    assert message in str(info.value)


def test_a_change_that_creates_what_it_uses(stack: Stack) -> None:
    """A new queue's share sees the queue (on a new service environment) that the same change
    creates; what the core would refuse is reported, not raised."""
    worked_example(stack.client)
    environment = {
        "serviceEnvironmentName": "se2",
        "serviceEnvironmentType": "SAGEMAKER_TRAINING",
        "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
    }
    queue = {
        "jobQueueName": "jq2",
        "priority": 1,
        "jobQueueType": "SAGEMAKER_TRAINING",
        "schedulingPolicyArn": "arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy",
        "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se2"}],
    }
    share = {
        "quotaShareName": "N1",
        "jobQueue": "jq2",
        "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
        "resourceSharingConfiguration": {"strategy": "RESERVE"},
        "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
    }
    impact = Api(stack.url).impact(
        [
            {"operation": "CreateServiceEnvironment", "request": environment},
            {"operation": "CreateJobQueue", "request": queue},
            {"operation": "CreateQuotaShare", "request": share},
        ]
    )
    new = next(r for r in impact["shares"] if r["quotaShareName"] == "N1")
    assert new["before"] is None and new["after"]["reserved"] == {G5: 1}
    assert impact["rejected"] == []
    assert "jq2" not in {q["jobQueueName"] for q in stack.client.describe_job_queues()["jobQueues"]}

    again = Api(stack.url).impact(
        [
            {
                "operation": "CreateJobQueue",
                "request": {
                    **queue,
                    "jobQueueName": "jq3",
                    "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}],
                },
            }
        ]
    )
    assert again["rejected"] == [
        {"input": "CreateJobQueue", "reason": "Service environment se is already used by job queue jq"}
    ]


KEYS: list[dict[str, Any]] = [
    {"access_key": "ADMIN", "secret_key": "admin-secret", "admin": True},
    {"access_key": "TEAM1", "secret_key": "team1-secret", "quota_shares": ["jq/QS1"]},
]


def test_only_admin_keys_may_ask(make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch) -> None:
    secured = make_stack(auth=Keyring.from_data(KEYS))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ADMIN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "admin-secret")
    assert Api(secured.url).impact([])["preempted_now"] == []  # the body is signed too
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "TEAM1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "team1-secret")
    with pytest.raises(CliError) as info:
        Api(secured.url).impact([])
    assert "gpuquota:PlanImpact" in str(info.value)
