"""The SigV4 verifier against AWS's published Signature Version 4 test suite.

Each ``.sreq`` file under ``tests/data/aws-sig-v4-test-suite`` is a raw HTTP request that AWS signed
with the suite's key (``AKIDEXAMPLE``) for service ``service`` in ``us-east-1`` at 2015-08-30T12:36:00Z,
and its ``.authz`` the ``Authorization`` header AWS computed (the suite's expected answer; the two
agree but for ``get-vanilla-with-session-token.sreq``, which carries ``get-vanilla``'s signature).
``gpuquota.gateway.auth.verify`` must accept every request with that header: duplicate and folded
headers, header values to trim, dot segments and repeated slashes in the path, unreserved and UTF-8
characters, query keys out of order, repeated and percent-encoded. The request line is split at its
first and last space, so a path with a space in it (``normalize-path/get-space``) stays whole.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from gpuquota.gateway.auth import AuthError, Keyring, SignedRequest, verify

SUITE = Path(__file__).parents[1] / "data" / "aws-sig-v4-test-suite"
VECTORS = sorted(SUITE.glob("*.sreq"))
KEYRING = Keyring.from_data(
    [{"access_key": "AKIDEXAMPLE", "secret_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "admin": True}]
)
SIGNED_AT = dt.datetime(2015, 8, 30, 12, 36, tzinfo=dt.UTC)


def signed(vector: Path) -> SignedRequest:
    """The request of ``vector`` with the ``Authorization`` header AWS computed for it."""
    request = parse(vector.read_text(encoding="utf-8"))
    authorization = vector.with_suffix(".authz").read_text(encoding="utf-8")
    return dataclasses.replace(request, headers={**request.headers, "authorization": [authorization]})


def parse(raw: str) -> SignedRequest:
    """A raw HTTP/1.1 request: a folded header line (one that starts with white space) continues the
    value above it, joined by a space, as an HTTP parser unfolds it."""
    head, _, body = raw.partition("\n\n")
    request_line, *lines = head.split("\n")
    method, _, rest = request_line.partition(" ")
    target = rest.rpartition(" ")[0]
    headers: dict[str, list[str]] = {}
    name = ""
    for line in lines:
        if line[:1] in (" ", "\t"):
            headers[name][-1] += " " + line.strip()
            continue
        name, _, value = line.partition(":")
        name = name.strip().lower()
        headers.setdefault(name, []).append(value.strip())
    raw_path, _, raw_query = target.partition("?")
    return SignedRequest(method, raw_path, raw_query, headers, body.encode())


def test_the_whole_suite_is_here() -> None:
    assert len(VECTORS) == 34


@pytest.mark.parametrize("vector", VECTORS, ids=lambda path: path.stem)
def test_verify_accepts_aws_signed_request(vector: Path) -> None:
    request = signed(vector)
    assert verify(request, KEYRING, SIGNED_AT, services=("service",)).access_key == "AKIDEXAMPLE"


@pytest.mark.parametrize("vector", VECTORS[:3], ids=lambda path: path.stem)
def test_verify_refuses_the_vector_with_one_more_header_signed(vector: Path) -> None:
    """A header the client did not sign is left out; one it claims to have signed is counted."""
    request = signed(vector)
    authorization = request.headers["authorization"][0].replace(
        "SignedHeaders=host;", "SignedHeaders=a;host;"
    )
    tampered = dataclasses.replace(
        request, headers={**request.headers, "a": ["1"], "authorization": [authorization]}
    )
    with pytest.raises(AuthError, match="does not match"):
        verify(tampered, KEYRING, SIGNED_AT, services=("service",))
