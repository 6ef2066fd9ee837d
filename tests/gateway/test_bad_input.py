"""No input gives a 5xx (issue #14): every malformed request is a 400 ``ClientException`` naming the
field, and a rejected create leaves nothing behind.

The fuzz test derives its inputs from botocore's own service model: for every operation gpuquota
serves, a plausible request is built from the input shape, then each member (and each member one
level down) is replaced by a wrong type, an out-of-range number or a bad string, or left out when
required.
"""

from __future__ import annotations

import base64
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import botocore.loaders
import pytest

from gpuquota.gateway import edge
from tests.gateway.conftest import Stack
from tests.gateway.helpers import G5, create_queue, create_share, payload, submit
from tests.gateway.test_resources import client_error

MODEL = botocore.loaders.Loader().load_service_model("batch", "service-2")
SHAPES: dict[str, Any] = MODEL["shapes"]
POLICY_ARN = "arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy"
HUGE = "__HUGE__"
"""Replaced by ``1e999`` in the JSON text (``json.dumps`` cannot write an out-of-range float)."""
KNOWN: dict[str, Any] = {
    "jobQueue": "jq",
    "quotaShareName": "QS1",
    "serviceEnvironment": "se",
    "schedulingPolicyArn": POLICY_ARN,
    "capacityUnit": G5,
    "serviceRequestPayload": payload(),
    "serviceJobType": "SAGEMAKER_TRAINING",
}
"""Members that get real names, so that requests reach the checks behind the first lookup."""
CREATED_NAME = {
    "CreateSchedulingPolicy": "name",
    "CreateServiceEnvironment": "serviceEnvironmentName",
    "CreateJobQueue": "jobQueueName",
    "CreateQuotaShare": "quotaShareName",
    "SubmitServiceJob": "jobName",
}
BAD_STRINGS = ("", "\ud800", "x" * 2000, "a\u0000b")
OUT_OF_RANGE = (-1, 2**63, 2**64, HUGE)


def plausible(shape_name: str, member: str = "", depth: int = 0) -> Any:
    """A value of the shape that a client could send (not necessarily one the operation accepts)."""
    if member in KNOWN:
        return KNOWN[member]
    shape = SHAPES[shape_name]
    kind = shape["type"]
    if kind == "string":
        return shape["enum"][0] if "enum" in shape else "fuzz"
    if kind in ("integer", "long"):
        return max(int(shape.get("min", 1)), 1)
    if kind in ("float", "double"):
        return 1.0
    if kind == "boolean":
        return False
    if kind == "timestamp":
        return 0
    if kind == "list":
        return [plausible(shape["member"]["shape"], depth=depth + 1)] if depth < 4 else []
    if kind == "map":
        return {"k": "v"}
    return {
        name: plausible(ref["shape"], name, depth + 1)
        for name, ref in shape.get("members", {}).items()
        if depth < 4
    }


def wrong_values(value: Any) -> list[Any]:
    """Values of the wrong type, out of range or badly formed in place of ``value``."""
    if isinstance(value, bool):
        return ["x", 1]
    if isinstance(value, int | float):
        return ["x", True, 1.5, *OUT_OF_RANGE]
    if isinstance(value, str):
        return [12345, ["x"], *BAD_STRINGS]
    if isinstance(value, list):
        return ["x", {"a": 1}, [None], [12345]]
    return ["x", ["x"], 12345, {"\ud800": "v"}]


def mutations(operation: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, request) for every malformed variant of the operation's plausible request."""
    shape = SHAPES[MODEL["operations"][operation]["input"]["shape"]]
    base = plausible(MODEL["operations"][operation]["input"]["shape"])
    out: list[tuple[str, dict[str, Any]]] = []
    for name in shape.get("members", {}):
        value = base[name]
        if name in shape.get("required", []):
            out.append((f"{name} missing", {k: v for k, v in base.items() if k != name}))
        for bad in wrong_values(value):
            out.append((f"{name}={bad!r:.40}", {**base, name: bad}))
        inner = value[0] if isinstance(value, list) and value else value
        if isinstance(inner, dict):
            for key, nested in inner.items():
                for bad in wrong_values(nested)[:3]:
                    changed = {**inner, key: bad}
                    out.append(
                        (
                            f"{name}.{key}={bad!r:.40}",
                            {**base, name: [changed] if inner is not value else changed},
                        )
                    )
    return out


def post(stack: Stack, operation: str, body: dict[str, Any] | bytes) -> tuple[int, dict[str, Any]]:
    uri = MODEL["operations"][operation]["http"]["requestUri"]
    data = body if isinstance(body, bytes) else json.dumps(body).replace(f'"{HUGE}"', "1e999").encode()
    request = urllib.request.Request(
        stack.url + uri, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"{}")


def existing_names(stack: Stack) -> set[str]:
    rm = stack.gateway.rm
    names = set(rm.policies) | set(rm.environments) | set(rm.queues) | {key[1] for key in rm.shares}
    return names | {job.spec.job_name for job in rm.jobs.values()}


@pytest.mark.slow
def test_no_malformed_member_gives_a_5xx_or_a_half_created_resource(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=2)
    stack.register_node(count=2)
    operations = [
        name
        for name in MODEL["operations"]
        if name.lower() in stack.gateway.operation_names and name not in ("DeleteJobQueue",)
    ]
    assert len(operations) >= 20
    server_errors, rejected_names, sent = [], set(), 0
    for number, operation in enumerate(operations):
        for index, (label, request) in enumerate(mutations(operation)):
            fresh = f"fuzz-{number}-{index}"
            name_member = CREATED_NAME.get(operation)
            if name_member is not None and request.get(name_member) == KNOWN.get(name_member, "fuzz"):
                request[name_member] = fresh
            code, body = post(stack, operation, request)
            sent += 1
            if code >= 500:
                server_errors.append(f"{operation} {label}: {code} {body}")
            elif code == 400:
                assert body.get("message"), f"{operation} {label}: a 400 without a message"
                rejected_names.add(fresh)
    assert sent >= 500
    assert server_errors == []
    assert existing_names(stack) & rejected_names == set()


def test_capacity_unit_empty_is_a_client_error(batch: Any) -> None:
    create_queue(batch)
    message = client_error(
        batch.create_quota_share,
        quotaShareName="QS1",
        jobQueue="jq",
        capacityLimits=[{"capacityUnit": "", "maxCapacity": 1}],
        resourceSharingConfiguration={"strategy": "LEND"},
        preemptionConfiguration={"inSharePreemption": "DISABLED"},
    )
    assert "capacityUnit" in message
    assert batch.list_quota_shares(jobQueue="jq")["quotaShares"] == []


def test_lone_surrogates_are_refused_at_the_edge(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    for tags in ({"k": "\ud800"}, {"\ud800": "v"}):
        message = client_error(batch.tag_resource, resourceArn=create_share_arn(), tags=tags)
        assert "surrogate" in message and "tags" in message
    body = payload(TrainingJobName="\ud800")
    message = client_error(
        batch.submit_service_job,
        jobName="j",
        jobQueue="jq",
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="QS1",
        serviceRequestPayload=body,
    )
    assert "serviceRequestPayload" in message
    assert batch.list_service_jobs(jobQueue="jq")["jobSummaryList"] == []


def create_share_arn() -> str:
    return "arn:aws:batch:us-east-1:000000000000:job-queue/jq/quota-share/QS1"


def test_deep_json_is_a_client_error(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    code, body = post(stack, "DescribeJobQueues", b"[" * 10_000 + b"]" * 10_000)
    assert code == 400 and "nested" in body["message"]
    code, body = post(stack, "DescribeJobQueues", b'{"a":' * 100 + b"1" + b"}" * 100)
    assert code == 400 and "nested" in body["message"]
    deep = "[" * 5000 + "]" * 5000
    message = client_error(
        batch.submit_service_job,
        jobName="j",
        jobQueue="jq",
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName="QS1",
        serviceRequestPayload=deep,
    )
    assert "serviceRequestPayload" in message and "nested" in message


def test_forged_next_tokens_are_client_errors(stack: Stack) -> None:
    batch = stack.client
    create_queue(batch)
    create_share(batch, "QS1", "LEND", limit=1)
    submit(batch, "j")
    paginated = [
        name
        for name in MODEL["operations"]
        if name.lower() in stack.gateway.operation_names
        and "nextToken" in SHAPES[MODEL["operations"][name]["input"]["shape"]].get("members", {})
    ]
    assert len(paginated) >= 5
    forged = [
        base64.urlsafe_b64encode(raw).decode()
        for raw in (b'{"offset": 1e999}', b'{"offset": -1}', b'{"offset": "1"}', b"[1]", b"[" * 5000)
    ]
    for operation in paginated:
        shape = MODEL["operations"][operation]["input"]["shape"]
        base = {k: v for k, v in plausible(shape).items() if k in SHAPES[shape].get("required", ())}
        for token in [*forged, "garbage", "\ud800"]:
            code, body = post(stack, operation, {**base, "nextToken": token})
            assert code == 400, (operation, token, body)
            assert "nextToken" in body["message"] or "surrogate" in body["message"], body


def test_a_body_held_open_is_answered(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge, "BODY_READ_SECONDS", 1.0)
    url = urllib.parse.urlsplit(stack.url)
    started = time.monotonic()
    assert url.port is not None
    with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
        head = (
            f"POST /v1/describejobqueues HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{"
        )
        conn.sendall(head.encode())
        answer = conn.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 400"), answer
    assert "not received within" in answer
    assert time.monotonic() - started < 20
