"""Authentication (AWS Signature Version 4) and authorization of the gateway (interface I2).

Theory of operation
-------------------
Off unless keys are configured (``--auth-keys FILE`` or ``GPUQUOTA_AUTH_KEYS``). The file is YAML
(or JSON, a subset): a list of keys, or ``{"keys": [...]}``, each::

    {access_key: AKIA..., secret_key: ..., admin: false, quota_shares: ["jq/QS1", "jq/QS2"]}

With keys, every request but ``GET /health`` must carry a valid SigV4 ``Authorization`` header
(``AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/batch/aws4_request, SignedHeaders=..., Signature=...``)
made with a configured key, as every AWS SDK signs with ``aws_access_key_id``/``aws_secret_access_key``.
:func:`verify` first applies gpuquota's own rules: ``host`` and ``x-amz-date`` must be signed,
``x-amz-date`` within 15 minutes of the server clock and on the scope's date, the scope's service
``batch`` (``sts`` or ``iam`` on the identity route, ``gpuquota.gateway.identity``; any region: the
gateway is one endpoint), and ``x-amz-content-sha256``, when sent, the body's hash. Then botocore's
own signer (``botocore.auth.SigV4Auth``) signs the request as it arrived (method, path, query, the
headers named in ``SignedHeaders``, body) with the key's secret for the credential's scope, and the
two signatures are compared in constant time; ``tests/gateway/test_auth.py`` verifies AWS's published
SigV4 test vectors (``tests/data/aws-sig-v4-test-suite``). Presigned URLs (the query-string form) and
temporary credentials are not supported.

Failures are HTTP 403 with AWS's codes: ``MissingAuthenticationTokenException`` (no signature),
``UnrecognizedClientException`` (unknown access key), ``InvalidSignatureException`` (anything else
wrong with the signature). A valid key that may not do what it asks gets ``AccessDeniedException``
(see :meth:`Principal.may`); botocore raises all of them as ``ClientError`` with that code.

An admin key may do everything. Any other key is limited to its quota shares (``QUEUE/SHARE``):
SubmitServiceJob into them; Update/Describe/TerminateServiceJob(s) of their jobs; ListServiceJobs,
whose answer the gateway filters to them. Every other operation is denied.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, HTTPHeaders
from botocore.credentials import Credentials
from botocore.utils import percent_encode_sequence
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuquota.gateway.errors import ApiError
from gpuquota.support.exposure import ALLOW_ENV, ALLOW_FLAG, check_exposure

log = logging.getLogger(__name__)

SERVICE = "batch"
MAX_SKEW = dt.timedelta(minutes=15)
AUTH_KEYS_ENV = "GPUQUOTA_AUTH_KEYS"

#: the operations a share-limited key may call (lower case, as in the request path)
SHARE_OPERATIONS = frozenset(
    {
        "submitservicejob",
        "updateservicejob",
        "describeservicejob",
        "terminateservicejob",
        "terminateservicejobs",
        "listservicejobs",
    }
)

_AUTH_HEADER = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-fA-F]{64})\s*$"
)
_AMZ_DATE = "%Y%m%dT%H%M%SZ"


class AuthError(ApiError):
    status = 403
    code = "InvalidSignatureException"


class MissingAuthenticationToken(AuthError):
    code = "MissingAuthenticationTokenException"


class UnrecognizedClient(AuthError):
    code = "UnrecognizedClientException"


class AccessDenied(AuthError):
    code = "AccessDeniedException"


class KeyConfigError(ValueError):
    """The keys file is missing, unreadable or invalid; the message says which and why."""


class _KeyEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    access_key: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_+=,.@-]+$")
    secret_key: str = Field(min_length=1)
    admin: bool = False
    quota_shares: tuple[str, ...] = ()

    @field_validator("quota_shares")
    @classmethod
    def _check_shares(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            queue, sep, share = item.partition("/")
            if not sep or not queue or not share or "/" in share:
                raise ValueError(f"quota share {item!r} is not QUEUE/SHARE")
        return value


@dataclass(frozen=True)
class Principal:
    """The key a request was signed with: an admin, or limited to ``(queue, share)`` pairs."""

    access_key: str
    admin: bool
    shares: frozenset[tuple[str, str]]

    def owns(self, queue: str, share: str) -> bool:
        return self.admin or (queue, share) in self.shares

    def may(self, operation: str) -> bool:
        """Whether this key may call ``operation`` (lower case) at all; shares are checked later."""
        return self.admin or operation in SHARE_OPERATIONS


@dataclass(frozen=True)
class Key:
    secret: str
    principal: Principal


class Keyring:
    """The configured keys by access key id."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self.keys: dict[str, Key] = {}
        for key in keys:
            if key.principal.access_key in self.keys:
                raise KeyConfigError(f"access key {key.principal.access_key} is configured twice")
            self.keys[key.principal.access_key] = key

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def from_data(cls, data: Any) -> Keyring:
        """From the parsed file: a list of entries or ``{"keys": [...]}``."""
        if isinstance(data, Mapping) and set(data) == {"keys"}:
            data = data["keys"]
        if not isinstance(data, list) or not data:
            raise KeyConfigError("expected a non-empty list of keys (or {keys: [...]})")
        keys = []
        for index, item in enumerate(data):
            try:
                entry = _KeyEntry.model_validate(item)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                raise KeyConfigError(f"key {index}: {where}: {error['msg']}".replace(": :", ":")) from None
            shares = frozenset(
                (queue, share) for queue, _, share in (s.partition("/") for s in entry.quota_shares)
            )
            keys.append(Key(entry.secret_key, Principal(entry.access_key, entry.admin, shares)))
        return cls(keys)

    @classmethod
    def load(cls, path: str | Path) -> Keyring:
        """Reads a YAML or JSON keys file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise KeyConfigError(f"cannot read auth keys file {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise KeyConfigError(f"auth keys file {path} is not valid YAML/JSON: {_where(exc)}") from None
        try:
            return cls.from_data(data)
        except KeyConfigError as exc:
            raise KeyConfigError(f"auth keys file {path}: {exc}") from None


def _where(exc: ValueError | yaml.YAMLError) -> str:
    """What is wrong with the file and where, without quoting it: PyYAML's message shows the line, and
    that line may hold a secret key."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return type(exc).__name__


def add_auth_keys(parser: argparse.ArgumentParser) -> None:
    """The ``--auth-keys FILE`` and ``--allow-unauthenticated`` flags of ``gpuquota up`` and ``gateway``."""
    parser.add_argument(
        "--auth-keys",
        metavar="FILE",
        default=None,
        help=f"require AWS SigV4 signatures made with the keys of this YAML/JSON file ({AUTH_KEYS_ENV}; "
        "default: no authentication)",
    )
    parser.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help=f"serve without --auth-keys on an address other than loopback ({ALLOW_ENV}=1; default: "
        "refuse to start)",
    )


def load_auth(
    path: str | None, host: str, command: str, allow_unauthenticated: bool = False
) -> Keyring | None:
    """The keyring of the keys file ``path``; ``None`` (no file): authentication is off.

    Raises ``KeyConfigError``, and ``Exposed`` when the API would listen beyond the loopback interface
    without keys and without ``allow_unauthenticated`` (``gpuquota.support.exposure``: the loopback rule).
    """
    if not path:
        give = f"--auth-keys FILE or {AUTH_KEYS_ENV}=FILE (docs/authentication.md)"
        check_exposure("the API", host, False, allow_unauthenticated, give)
        return None
    keyring = Keyring.load(path)
    log.info("%s: SigV4 authentication on, %d keys from %s", command, len(keyring), path)
    return keyring


# ----- Signature Version 4 -----------------------------------------------------------------------


@dataclass(frozen=True)
class SignedRequest:
    """What :func:`verify` needs of an HTTP request; ``headers`` maps lower-case names to values."""

    method: str
    raw_path: str
    raw_query: str
    headers: Mapping[str, list[str]]
    body: bytes


class _WireSigner(SigV4Auth):  # type: ignore[misc]  # botocore ships no type hints
    """botocore's SigV4 signer, over the headers the client named in ``SignedHeaders``: botocore
    leaves ``user-agent`` and a few others out of what it signs, but another SDK may sign them."""

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        headers: HTTPHeaders = request.headers
        return headers


def expected_signature(
    request: SignedRequest, signed: list[str], key: Key, amz_date: str, region: str, service: str
) -> str:
    """The signature botocore's signer computes for ``request`` as it arrived, over its ``signed``
    headers: the path as sent (botocore removes dot segments and empty ones and encodes it once
    more), the query decoded and re-encoded as botocore encodes one, and the body."""
    pairs = (part.partition("=") for part in request.raw_query.split("&") if part)
    query = percent_encode_sequence([(unquote(name), unquote(value)) for name, _, value in pairs])
    wire = AWSRequest(request.method, f"http://gateway{request.raw_path}{'?' if query else ''}{query}")
    wire.data = request.body
    wire.headers = HTTPHeaders()
    for name in signed:
        for value in request.headers[name]:
            wire.headers[name] = value
    wire.context["timestamp"] = amz_date
    signer = _WireSigner(Credentials(key.principal.access_key, key.secret), service, region)
    return str(signer.signature(signer.string_to_sign(wire, signer.canonical_request(wire)), wire))


def verify(
    request: SignedRequest, keyring: Keyring, now: dt.datetime, services: tuple[str, ...] = (SERVICE,)
) -> Principal:
    """The principal whose key signed ``request`` for one of ``services`` (the scope's service name:
    ``batch``; ``sts`` and ``iam`` on the identity route); raises an :class:`AuthError` otherwise."""
    values = request.headers.get("authorization")
    if not values:
        raise MissingAuthenticationToken("Missing Authentication Token")
    if len(values) != 1:
        raise AuthError("Only one Authorization header is allowed")
    match = _AUTH_HEADER.match(values[0].strip())
    if match is None:
        raise AuthError(
            "Authorization header requires the AWS4-HMAC-SHA256 algorithm with Credential, "
            "SignedHeaders and Signature parameters"
        )
    access_key, _, scope_rest = match["credential"].partition("/")
    scope_parts = scope_rest.split("/")
    if len(scope_parts) != 4 or scope_parts[3] != "aws4_request":
        raise AuthError("Credential must have the form KEY/YYYYMMDD/REGION/SERVICE/aws4_request")
    scope_date, region, service, _ = scope_parts
    if service not in services:
        names = "' or '".join(services)
        raise AuthError(f"Credential should be scoped to the correct service: '{names}'")
    if not re.fullmatch(r"[a-z0-9-]{1,64}", region):
        raise AuthError("Credential should be scoped to a valid region")
    key = keyring.keys.get(access_key)
    if key is None:
        raise UnrecognizedClient("The security token included in the request is invalid")

    signed = match["signed"].split(";")
    if signed != sorted(set(signed)) or any(name != name.lower() for name in signed):
        raise AuthError("SignedHeaders must be lower-case, sorted and unique")
    for required in ("host", "x-amz-date"):
        if required not in signed:
            raise AuthError(f"'{required}' must be a signed header")
    missing = [name for name in signed if not request.headers.get(name)]
    if missing:
        raise AuthError(f"Signed headers missing from the request: {', '.join(missing)}")

    amz_date = request.headers["x-amz-date"][0].strip()
    try:
        at = dt.datetime.strptime(amz_date, _AMZ_DATE).replace(tzinfo=dt.UTC)
    except ValueError:
        raise AuthError("X-Amz-Date must have the form YYYYMMDD'T'HHMMSS'Z'") from None
    if abs(now - at) > MAX_SKEW:
        raise AuthError(
            f"Signature expired: {amz_date} is now earlier or later than "
            f"{(now - MAX_SKEW).strftime(_AMZ_DATE)} .. {(now + MAX_SKEW).strftime(_AMZ_DATE)}"
        )
    if scope_date != amz_date[:8]:
        raise AuthError("Credential date does not match X-Amz-Date")

    body_hash = hashlib.sha256(request.body).hexdigest()
    declared = request.headers.get("x-amz-content-sha256")
    if declared is not None and (len(declared) != 1 or declared[0].strip().lower() != body_hash):
        raise AuthError("x-amz-content-sha256 does not match the request body")

    expected = expected_signature(request, signed, key, amz_date, region, service)
    if not hmac.compare_digest(expected, match["signature"].lower()):
        raise AuthError(
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method."
        )
    return key.principal
