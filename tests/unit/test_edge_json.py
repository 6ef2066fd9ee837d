"""The gateway's edge takes a request body's JSON apart once and, for the usual body, judges its depth
and strings from the text alone (``gateway.edge.parse_json``): it must refuse exactly what walking the
parsed value refuses, whichever way a lone surrogate or deep nesting is written."""

from __future__ import annotations

import json

import pytest

from gpuquota.gateway.edge import MAX_JSON_DEPTH, check_json, parse_json
from gpuquota.gateway.errors import ClientException

BAD = [
    b'{"a": "\\ud800"}',  # an escaped lone surrogate
    b'{"a": "\\uDC00x"}',
    b'{"\\udbff": 1}',  # in a key
    '{"a": "\ud800"}'.encode("utf-8", "surrogatepass"),  # raw surrogate bytes, decoded with surrogatepass
    json.dumps({"a": "\ud800"}, ensure_ascii=False).encode("utf-16", "surrogatepass"),  # UTF-16 body
    b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
    b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1),
]
GOOD = [
    b'{"a": "\\ud83d\\ude00"}',  # a surrogate pair is one character
    '{"a": "\U0001f600 é"}'.encode(),
    b'{"a": "\\u00e9", "b": "\\\\ud800"}',  # an escaped backslash, then text that looks like an escape
    b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH,
    b'{"a": "' + b"[" * 100 + b'"}',  # brackets in a string are not nesting
    json.dumps({"a": "x"}).encode("utf-16"),
]


def refused(raw: bytes | str) -> str | None:
    try:
        parse_json(raw, "The body")
    except ClientException as exc:
        return exc.message
    return None


@pytest.mark.parametrize("raw", BAD)
def test_bad_bodies_are_refused_with_the_walks_message(raw: bytes) -> None:
    value = json.loads(raw)  # valid JSON: only the check refuses it
    with pytest.raises(ClientException) as walked:
        check_json(value, "The body")
    assert refused(raw) == walked.value.message
    assert refused(raw.decode(json.detect_encoding(raw), "surrogatepass")) == walked.value.message


@pytest.mark.parametrize("raw", GOOD)
def test_good_bodies_parse_as_json_loads_does(raw: bytes) -> None:
    assert refused(raw) is None
    assert parse_json(raw, "The body") == json.loads(raw)


def test_not_json_is_a_client_error() -> None:
    assert refused(b"\xff\xfe\x00") == "The body is not valid JSON"
    assert refused(b'{"a": ') == "The body is not valid JSON"
