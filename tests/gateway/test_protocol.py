"""The REST-JSON wire format itself: error headers and bodies, bad requests, health."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpuquota.read.model import ReadModel
from gpuquota.wire import events as ev
from tests.gateway.conftest import Stack, wait_for
from tests.gateway.helpers import submit, worked_example


def call(stack: Stack, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(stack.url + path, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), json.loads(error.read() or b"null")


def test_health(stack: Stack) -> None:
    status, _, body = call(stack, "GET", "/health")
    assert (status, body) == (200, {"status": "ok"})


def test_live_is_503_once_the_read_model_cannot_apply_an_event(
    stack: Stack, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A projection error fails liveness in both modes (``read.projection``): embedded at once, the
    distributed gateway once its rebuild from the log meets the same error."""
    worked_example(batch)
    assert call(stack, "GET", "/health/live")[:3:2] == (200, {"status": "live"})

    def projection_bug(_: ReadModel, event: ev.JobAccepted) -> None:
        raise RuntimeError("a projection bug")

    monkeypatch.setattr(ReadModel, "_on_JobAccepted", projection_bug)
    with contextlib.suppress(ClientError):  # distributed: no decision comes back in time
        submit(batch, "job", "QS1", 1)
    wait_for(lambda: call(stack, "GET", "/health/live")[0] == 503, timeout=60)
    reason = call(stack, "GET", "/health/live")[2]["reason"]
    assert "could not apply JobAccepted" in reason and "a projection bug" in reason, reason


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        ("POST", "/v1/createquotashare", b"{not json", "not valid JSON"),
        ("POST", "/v1/createquotashare", b"[1, 2]", "must be a JSON object"),
        ("POST", "/v1/nosuchoperation", b"{}", "Unknown operation"),
        ("GET", "/v1/describejobqueues", None, "Unknown operation"),
        ("POST", "/elsewhere", b"{}", "Unknown operation"),
        ("POST", "/v1/createschedulingpolicy", b'{"name": 5}', "expected a string"),
        ("POST", "/v1/createschedulingpolicy", b"{}", "Missing required parameter: name"),
        ("POST", "/v1/describeservicejob", b'{"jobId": ["a"]}', "expected a string"),
        ("POST", "/v1/listservicejobs", b'{"maxResults": "10"}', "expected an integer"),
        ("POST", "/v1/listservicejobs", b'{"maxResults": true}', "expected an integer"),
        ("POST", "/v1/listservicejobs", b'{"filters": {"name": "JOB_NAME"}}', "expected a list"),
        ("POST", "/v1/createschedulingpolicy", b'{"name": "p", "tags": []}', "expected a map"),
        ("POST", "/v1/updatequotashare", b'{"quotaShareArn": "QS1"}', "not a valid quota share ARN"),
    ],
)
def test_bad_requests_are_client_exceptions(
    stack: Stack, method: str, path: str, body: bytes | None, message: str
) -> None:
    status, headers, payload = call(stack, method, path, body)
    assert status == 400
    assert headers["x-amzn-ErrorType"] == "ClientException"
    assert message in payload["message"]


def test_oversized_body_is_a_client_exception(stack: Stack) -> None:
    status, headers, payload = call(
        stack, "POST", "/v1/submitservicejob", b'{"jobName": "' + b"x" * 2_000_000 + b'"}'
    )
    assert status == 400 and headers["x-amzn-ErrorType"] == "ClientException"


def test_internal_errors_are_server_exceptions(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = stack.gateway
    assert gateway is not None

    async def broken(_: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setitem(gateway.operations, "listschedulingpolicies", broken)
    status, headers, payload = call(stack, "POST", "/v1/listschedulingpolicies", b"{}")
    assert (status, headers["x-amzn-ErrorType"], payload) == (
        500,
        "ServerException",
        {"message": "Internal server error"},
    )
