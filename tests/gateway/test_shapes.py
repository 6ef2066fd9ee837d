"""Request bodies against botocore's ``batch`` model (``gpuquota.gateway.shapes``), without a server:
each rule the model holds, in the gateway's texts, and what the model leaves to the operations."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota.gateway.app import CHECKED
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.shapes import batch_shapes

SHAPES = batch_shapes(CHECKED)
SUBMIT: dict[str, Any] = {
    "jobName": "j",
    "jobQueue": "jq",
    "serviceJobType": "SAGEMAKER_TRAINING",
    "serviceRequestPayload": "{}",
    "quotaShareName": "QS1",
}


def refused(operation: str, body: dict[str, Any]) -> str:
    with pytest.raises(ClientException) as info:
        SHAPES.check(operation, body)
    return info.value.message


def test_every_operation_served_has_its_shape() -> None:
    assert set(SHAPES.checks) == set(CHECKED) and len(CHECKED) == 26


def test_a_well_formed_body_passes_and_unknown_members_are_ignored() -> None:
    SHAPES.check("SubmitServiceJob", {**SUBMIT, "tags": {"k": "v"}, "notInTheModel": [1]})
    SHAPES.check("SubmitServiceJob", {**SUBMIT, "retryStrategy": {"attempts": 2}, "clientToken": None})


@pytest.mark.parametrize(
    ("operation", "body", "message"),
    [
        ("SubmitServiceJob", {"jobQueue": "jq"}, "Missing required parameter: jobName"),
        ("SubmitServiceJob", {**SUBMIT, "jobName": None}, "Missing required parameter: jobName"),
        (
            "SubmitServiceJob",
            {**SUBMIT, "retryStrategy": {}},
            "Missing required parameter: retryStrategy.attempts",
        ),
        (
            "SubmitServiceJob",
            {**SUBMIT, "jobName": 5},
            "Invalid type for parameter jobName: expected a string",
        ),
        (
            "SubmitServiceJob",
            {**SUBMIT, "schedulingPriority": True},
            "Invalid type for parameter schedulingPriority: expected an integer",
        ),
        (
            "SubmitServiceJob",
            {**SUBMIT, "schedulingPriority": 2**31},
            "schedulingPriority must be at most 2147483647, got 2147483648",
        ),
        ("SubmitServiceJob", {**SUBMIT, "tags": []}, "Invalid type for parameter tags: expected a map"),
        (
            "SubmitServiceJob",
            {**SUBMIT, "tags": {"k": 1}},
            "Invalid type for parameter tags.k: expected a string",
        ),
        ("SubmitServiceJob", {**SUBMIT, "tags": {"": "v"}}, "tags key '' must be 1 to 128 characters"),
        ("SubmitServiceJob", {**SUBMIT, "tags": {"k": "v" * 257}}, "tags.k must be at most 256 characters"),
        ("SubmitServiceJob", {**SUBMIT, "clientToken": "t" * 65}, "clientToken must be 1 to 64 characters"),
        (
            "SubmitServiceJob",
            {**SUBMIT, "serviceJobType": "EKS"},
            "serviceJobType must be one of SAGEMAKER_TRAINING, got EKS",
        ),
        (
            "SubmitServiceJob",
            {**SUBMIT, "retryStrategy": {"attempts": 1, "evaluateOnExit": [{"action": "AGAIN"}]}},
            "retryStrategy.evaluateOnExit[0].action must be one of RETRY, EXIT, got AGAIN",
        ),
        (
            "CreateJobQueue",
            {"jobQueueName": "q", "priority": 1, "jobStateTimeLimitActions": [{"state": "RUNNING"}]},
            "Missing required parameter: jobStateTimeLimitActions[0].reason",
        ),
        (
            "UpdateQuotaShare",
            {"quotaShareArn": "a", "resourceSharingConfiguration": {"strategy": "SHARE"}},
            "resourceSharingConfiguration.strategy must be one of RESERVE, LEND, LEND_AND_BORROW, got SHARE",
        ),
        (
            "TerminateServiceJobs",
            {"jobs": ["a", 1], "reason": "r"},
            "Invalid type for parameter jobs[1]: expected a string",
        ),
        ("TagResource", {}, "Missing required parameter: tags"),
    ],
)
def test_what_the_model_refuses(operation: str, body: dict[str, Any], message: str) -> None:
    assert refused(operation, body) == message


def test_what_the_model_leaves_to_the_operations() -> None:
    """The URI's members, AWS's case-insensitive exit action, gpuquota's narrower enums and ranges."""
    SHAPES.check("TagResource", {"tags": {"k": "v"}})  # resourceArn is in the URI
    SHAPES.check(
        "SubmitServiceJob",
        {**SUBMIT, "retryStrategy": {"attempts": 1, "evaluateOnExit": [{"action": "retry"}]}},
    )
    SHAPES.check("CreateJobQueue", {"jobQueueName": "q", "priority": 5000, "jobQueueType": "EKS"})
    SHAPES.check("SubmitServiceJob", {**SUBMIT, "tags": {f"k{i}": "v" for i in range(60)}})
