"""The client side of the command line: boto3 for the AWS Batch API, urllib for gpuquota's own reads.

Every failure a user can cause (no server, an unknown name, a refused request) becomes a
:class:`CliError` with a one-line message; the commands print it and exit 1, never a traceback.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

DEFAULT_ENDPOINT = "http://127.0.0.1:8642"
ENDPOINT_ENV = "GPUQUOTA_ENDPOINT"
REGION = "us-east-1"

T = TypeVar("T")


class CliError(Exception):
    """A failure to report in one line (exit code 1)."""


def default_endpoint() -> str:
    return os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


def _unreachable(endpoint: str, why: str) -> CliError:
    return CliError(f"cannot reach gpuquota at {endpoint}: {why} (is `gpuquota up` running? see --endpoint)")


def _reason(exc: BaseException) -> str:
    reason: Any = getattr(exc, "reason", None) or exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    underlying = getattr(exc, "kwargs", {}).get("error")  # botocore wraps the urllib3 error
    text = f"{reason} {underlying or ''}".lower()
    if "refused" in text:
        return "connection refused"
    if "name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    if "timed out" in text:
        return "timed out"
    return str(reason)


OUTPUTS_KEY = "gpuquotaOutputs"
"""gpuquota's key in a DescribeServiceJob attempt (where the attempt's model is); not in AWS's model."""
LOST_WORK_KEY = "gpuquotaLostWork"
"""gpuquota's key in a preempted DescribeServiceJob attempt: the work it lost (S12)."""
CHECKPOINT_KEY = "gpuquotaCheckpointAt"
"""gpuquota's key in a DescribeServiceJob attempt: its last checkpoint, epoch ms (S12)."""


def keep_attempt_outputs(http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
    """botocore drops the keys its service model lacks: copy each attempt's gpuquota keys back."""
    try:
        raw = json.loads(http_response.content or b"{}").get("attempts") or []
    except (ValueError, AttributeError):
        return
    for attempt, sent in zip(parsed.get("attempts") or [], raw, strict=False):
        for key in (OUTPUTS_KEY, LOST_WORK_KEY, CHECKPOINT_KEY):
            if isinstance(sent, dict) and key in sent:
                attempt[key] = sent[key]


class Api:
    """One gpuquota endpoint: ``batch`` is an unmodified boto3 ``batch`` client pointed at it."""

    def __init__(self, endpoint: str | None = None, *, timeout: float = 30.0) -> None:
        self.endpoint = (endpoint or default_endpoint()).rstrip("/")
        parsed = urllib.parse.urlparse(self.endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise CliError(f"invalid endpoint {self.endpoint!r}: expected http://HOST:PORT")
        self.timeout = timeout
        self._batch: Any = None

    @property
    def batch(self) -> Any:
        if self._batch is None:
            import boto3
            from botocore.config import Config

            credentials: dict[str, str] = {}
            if not _configured_credentials():
                # Authentication is off by default: any key signs (and skips the credential chain).
                credentials = {"aws_access_key_id": "gpuquota", "aws_secret_access_key": "gpuquota"}
            self._batch = boto3.client(
                "batch",
                endpoint_url=self.endpoint,
                region_name=REGION,
                config=Config(
                    retries={"max_attempts": 1, "mode": "standard"},
                    connect_timeout=5,
                    read_timeout=self.timeout,
                ),
                **credentials,
            )
            self._batch.meta.events.register("after-call.batch.DescribeServiceJob", keep_attempt_outputs)
        return self._batch

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """``batch.<operation>(**params)`` without ``ResponseMetadata``; errors become ``CliError``."""
        with self.errors():
            out = dict(getattr(self.batch, operation)(**params))
        out.pop("ResponseMetadata", None)
        return out

    def pages(self, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
        """Every item under ``key`` across the pages of a list operation (boto3's paginator of
        ``operation``: botocore's ``batch`` model says which token to follow)."""
        with self.errors():
            pages = self.batch.get_paginator(operation).paginate(**params)
            return [item for page in pages for item in page.get(key, [])]

    @contextmanager
    def errors(self) -> Iterator[None]:
        from botocore.exceptions import (
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        try:
            yield
        except ClientError as exc:
            message = exc.response.get("Error", {}).get("Message") or str(exc)
            raise CliError(str(message)) from None
        except (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError) as exc:
            raise _unreachable(self.endpoint, _reason(exc)) from None
        except ReadTimeoutError:
            raise _unreachable(self.endpoint, "timed out") from None

    def get(self, path: str, **query: str | None) -> dict[str, Any]:
        """``GET`` one of gpuquota's own read endpoints (``/gpuquota/v1/...``) as JSON."""
        return self.request("GET", path, **query)

    def request(self, method: str, path: str, **query: str | None) -> dict[str, Any]:
        """``method`` (without a body) on one of gpuquota's own endpoints, answered as JSON."""
        params = {k: v for k, v in query.items() if v is not None}
        url = self.endpoint + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
        return self._answer(self._signed(method, url), url)

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST`` ``payload`` as JSON to one of gpuquota's own endpoints, answered as JSON."""
        url = self.endpoint + path
        return self._answer(self._signed("POST", url, json.dumps(payload).encode()), url)

    def _answer(self, request: urllib.request.Request, url: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise CliError(_error_message(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise _unreachable(self.endpoint, _reason(exc)) from None
        try:
            data = json.loads(body)
        except ValueError:
            raise CliError(f"{url} did not answer JSON") from None
        if not isinstance(data, dict):
            raise CliError(f"{url} did not answer a JSON object")
        return data

    def _signed(self, method: str, url: str, data: bytes | None = None) -> urllib.request.Request:
        """A ``method`` request of ``url`` (with ``data``), SigV4-signed with the ``batch`` client's keys."""
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        credentials = boto3.Session().get_credentials() if _configured_credentials() else None
        signer = SigV4Auth(credentials or Credentials("gpuquota", "gpuquota"), "batch", REGION)
        # the gateway takes a POST only as JSON (gpuquota.gateway.browser_guard), even without a body
        headers = {"Content-Type": "application/json"} if method == "POST" else {}
        request = AWSRequest(method=method, url=url, headers=headers, data=data)
        signer.add_auth(request)
        return urllib.request.Request(url, data, headers=dict(request.headers.items()), method=method)

    def shares(self, queue: str | None = None) -> list[dict[str, Any]]:
        rows = self.get("/gpuquota/v1/shares", queue=queue)["quotaShares"]
        return list(rows)

    def explain(self, job: str) -> dict[str, Any]:
        return self.get(f"/gpuquota/v1/jobs/{urllib.parse.quote(job, safe='')}/explain")

    def logs(self, job: str, attempt: int | None, offset: int) -> dict[str, Any]:
        path = f"/gpuquota/v1/jobs/{urllib.parse.quote(job, safe='')}/logs"
        return self.get(path, attempt=None if attempt is None else str(attempt), offset=str(offset))

    def impact(self, operations: list[dict[str, Any]]) -> dict[str, Any]:
        """What these writes would do to the jobs (``gpuquota apply --dry-run``), nothing applied."""
        return dict(self.post("/gpuquota/v1/impact", {"operations": operations})["impact"])

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.get("/gpuquota/v1/nodes")["nodes"])

    def plans(self) -> list[dict[str, Any]]:
        return list(self.get("/gpuquota/v1/plans")["trainingPlans"])

    def put_plan(self, plan: dict[str, Any]) -> dict[str, Any]:
        return self.post("/gpuquota/v1/plans", plan)

    def delete_plan(self, name: str) -> dict[str, Any]:
        return self.request("DELETE", f"/gpuquota/v1/plans/{urllib.parse.quote(name, safe='')}")

    def set_draining(self, node: str, draining: bool) -> dict[str, Any]:
        action = "drain" if draining else "undrain"
        return self.request("POST", f"/gpuquota/v1/nodes/{urllib.parse.quote(node, safe='')}/{action}")

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None


def _configured_credentials() -> bool:
    """Whether the environment names AWS credentials (a gateway with ``--auth-keys`` needs them)."""
    return bool(os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE"))


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
    except ValueError:
        body = None
    finally:
        exc.close()
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return f"HTTP {exc.code} {exc.reason}"


def poll(condition: Callable[[], T | None], deadline: float, interval: float = 0.1) -> T | None:
    """Call ``condition`` until it returns something other than ``None`` or the monotonic ``deadline``
    passes; return the last value (``None`` if it never held)."""
    import time

    while True:
        value = condition()
        if value is not None or time.monotonic() >= deadline:
            return value
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
