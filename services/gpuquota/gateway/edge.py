"""The gateway's edge: what a request body must be before any operation sees it, and the error
responses. No input, however malformed, may produce a 5xx (issue #14): every bad body is an AWS-style
400 ``ClientException`` whose message names the field.

- Bodies are read within ``BODY_READ_SECONDS`` (a client that holds a truncated body open is answered,
  not waited on).
- JSON is nested at most ``MAX_JSON_DEPTH`` levels (deeper input would exhaust the parser's recursion).
- Strings (keys and values) may not hold lone UTF-16 surrogates: they cannot be encoded as UTF-8, so
  they could be neither stored nor echoed back.
- A pydantic ``ValidationError`` that escapes an operation is the request's fault, so a 400 too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gpuquota.gateway.errors import ApiError, ClientException, ServerException
from gpuquota.gateway.params import Params
from gpuquota.support.ids import uuid4

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32
"""AWS request shapes nest a handful of levels; SageMaker payloads a few more."""
BODY_READ_SECONDS = 10.0
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(raw: str | bytes, what: str) -> Any:
    """``raw`` parsed, or a ``ClientException`` naming ``what`` (too deep, not JSON, bad strings)."""
    try:
        # what json.loads does with bytes, done here to look at the text first
        text = raw if isinstance(raw, str) else raw.decode(json.detect_encoding(raw), "surrogatepass")
        value = json.loads(text)
    except RecursionError:
        raise ClientException(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError:
        raise ClientException(f"{what} is not valid JSON") from None
    if not _plainly_well_formed(text):
        check_json(value, what)
    return value


def _plainly_well_formed(text: str) -> bool:
    """Whether the value parsed from ``text`` passes ``check_json``, seen from the text alone (the
    usual request, without walking the value): it has no more brackets than the depth allowed, and
    neither a surrogate nor the escape of one (a lone surrogate can come from nothing else)."""
    return (
        text.count("{") + text.count("[") <= MAX_JSON_DEPTH
        and (text.isascii() or _SURROGATE.search(text) is None)
        and ("\\u" not in text or _SURROGATE_ESCAPE.search(text) is None)
    )


def check_json(value: Any, what: str) -> None:
    """Depth and surrogates of a parsed JSON value, walked without recursion."""
    if _well_formed(value):
        return  # the usual case: no path is built for a value that passes
    stack: list[tuple[Any, str, int]] = [(value, what, 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise ClientException(f"Invalid value for {path}: a string holds a lone UTF-16 surrogate")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise ClientException(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise ClientException(f"Invalid key in {path}: a string holds a lone UTF-16 surrogate")
            stack.append((child, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]", depth + 1))


def _well_formed(value: Any) -> bool:
    """``check_json`` would pass ``value``: the same walk without the paths its messages need."""
    search = _SURROGATE.search
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if search(item):
                return False
        elif isinstance(item, dict):
            if depth > MAX_JSON_DEPTH or any(search(key) for key in item):
                return False
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            if depth > MAX_JSON_DEPTH:
                return False
            stack.extend((child, depth + 1) for child in item)
    return True


def body_params(raw: bytes) -> Params:
    """The request body as ``Params`` (an empty body is an empty object)."""
    if not raw.strip():
        return Params({})
    body = parse_json(raw, "The request body")
    if not isinstance(body, dict):
        raise ClientException("The request body must be a JSON object")
    return Params(body)  # parse_json checked every member (its messages name the member's path)


def validation_message(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"Invalid value for {where}: {error['msg']}" if where else str(error["msg"])


_TOKEN_JOBS = uuid.UUID("6f1c1f2e-8d4b-5a57-9a0e-7c3b2f0d9e41")
"""The namespace of job ids derived from client tokens (any fixed UUID: it only has to stay the same)."""


def token_job_id(pool: str, token: str) -> str:
    """The job id of a submission with ``clientToken`` ``token``: the same for every retry, whichever
    gateway takes it (a restarted one may not know the first try yet), so the core can recognise it."""
    return str(uuid.uuid5(_TOKEN_JOBS, f"{pool}\n{token}"))


def json_response(
    data: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    response_headers = {"x-amzn-RequestId": uuid4()}
    if headers:
        response_headers.update(headers)
    return web.Response(
        status=status,
        body=json.dumps(data).encode(),
        content_type="application/json",
        headers=response_headers,
    )


def error_response(exc: ApiError) -> web.Response:
    headers = {"x-amzn-ErrorType": exc.code, **exc.headers}
    return json_response({"message": exc.message}, status=exc.status, headers=headers)


async def read_body(request: web.Request) -> None:
    """Read the body within ``BODY_READ_SECONDS``; aiohttp keeps it for later ``request.read()``."""
    if not request.body_exists or request.content.is_eof():
        return  # no body, or all of it arrived with the headers (the usual request): nothing to wait for
    try:
        async with asyncio.timeout(BODY_READ_SECONDS):
            await request.read()
    except TimeoutError:
        raise ClientException(f"The request body was not received within {BODY_READ_SECONDS:g} s") from None


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        await read_body(request)
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except ValidationError as exc:
        return error_response(ClientException(validation_message(exc)))
    except web.HTTPException as exc:
        if exc.status < 500:
            return error_response(ClientException(exc.reason))
        return error_response(ServerException(exc.reason))
    except Exception:
        log.exception("internal error in %s %s", request.method, request.path)
        return error_response(ServerException("Internal server error"))
