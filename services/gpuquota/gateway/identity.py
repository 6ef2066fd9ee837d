"""Who the caller is, for the SageMaker SDK: STS ``GetCallerIdentity`` and IAM ``GetRole`` (issue #31).

Theory of operation
-------------------
The blog's ``ModelTrainer`` (no ``role``, no ``output_data_config``) needs two answers before it sends
anything to AWS Batch, and reading the SDK (``sagemaker.core.helper.iam_role_resolver``,
``session_helper.Session.default_bucket``) shows exactly which:

- **Who am I?** STS ``GetCallerIdentity``: the *account* names the default bucket
  (``sagemaker-<region>-<account>``, which S3 calls must own: ``ExpectedBucketOwner``), and the
  caller's ARN, when it is an *assumed role*, names the execution role the job will run as.
- **What is that role?** IAM ``GetRole`` of the role name in the caller's ARN; the SDK takes its
  ``Arn``. Then, unless ``SAGEMAKER_VALIDATE_ROLE=false`` (``gpuquota env`` sets it), it simulates
  the role's policies (``SimulatePrincipalPolicy``) and reads its trust policy (``GetRole`` again).

So the gateway answers those and nothing more:

- The *caller* of a request is a session of the *stack role* ``gpuquota``:
  ``arn:aws:sts::<account>:assumed-role/gpuquota/<access key>`` for the key that signed it, and the
  session ``local`` when authentication is off (the *local identity*). The account is the one of
  every gpuquota ARN (``ArnFactory.account``, ``000000000000`` unless configured).
- ``GetRole`` knows one role, the stack role, trusted by ``sagemaker.amazonaws.com`` (the training
  jobs run as it, as SageMaker's do); any other name is ``NoSuchEntity``.
- Every other IAM action is ``AccessDenied``: gpuquota has no IAM policies, so there is nothing to
  simulate, and the SDK reads a denied simulation as "cannot verify" (a warning, not a failure).
- Anything else is ``InvalidAction``.

The wire is AWS's *query protocol*, as botocore sends it to ``AWS_ENDPOINT_URL_STS`` and
``AWS_ENDPOINT_URL_IAM``: ``POST /`` with the form body ``Action=...&Version=...``; the answer is
XML, errors an ``ErrorResponse`` document. ``Version`` tells the two services apart (STS
``2011-06-15``, IAM ``2010-05-08``); with authentication on, the request must be SigV4-signed for
``sts`` or ``iam`` (any region) with a configured key.

Why a form POST is safe here although the browser guard (``gpuquota.gateway.browser_guard``) refuses
every other non-JSON POST: a web page can send a form without a CORS preflight, but this route only
*reads* (who the caller is, one fixed role) and changes nothing, the answer cannot be read by another
origin (no CORS headers), and with authentication on the page cannot sign. The guard's host and
origin rules still apply to it (DNS rebinding and cross-site pages are refused before the body is
read), and the body is at most ``MAX_QUERY_BYTES``.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from xml.sax.saxutils import escape

from aiohttp import web

from gpuquota.gateway.access import authenticate
from gpuquota.gateway.auth import (
    AuthError,
    Keyring,
    MissingAuthenticationToken,
    Principal,
    UnrecognizedClient,
)
from gpuquota.gateway.errors import ApiError
from gpuquota.support.clock import Clock

STS_VERSION = "2011-06-15"
IAM_VERSION = "2010-05-08"
NAMESPACES = {
    "sts": f"https://sts.amazonaws.com/doc/{STS_VERSION}/",
    "iam": f"https://iam.amazonaws.com/doc/{IAM_VERSION}/",
}
SERVICE_OF_VERSION = {STS_VERSION: "sts", IAM_VERSION: "iam"}
SIGNING_SERVICES = ("sts", "iam")
STACK_ROLE = "gpuquota"
"""The role every caller is a session of, and the training jobs run as."""
LOCAL_SESSION = "local"
"""The session name of the local identity (authentication off)."""
MAX_QUERY_BYTES = 16 * 1024
"""A query request is a few parameters; nothing the SDK sends comes near."""
TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}
ROLE_CREATED = "2024-01-01T00:00:00Z"
"""The stack role's ``CreateDate`` (required by the answer's shape; nothing reads it)."""


class QueryError(ApiError):
    """An error of the query protocol: HTTP ``status``, AWS's ``code``, ``Sender`` or ``Receiver``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


#: the query protocol's codes for the gateway's SigV4 failures (STS's own names)
AUTH_CODES: dict[type[AuthError], str] = {
    MissingAuthenticationToken: "MissingAuthenticationToken",
    UnrecognizedClient: "InvalidClientTokenId",
}


@dataclass(frozen=True)
class Caller:
    """Who signed a request, as STS and IAM name it."""

    account: str
    session: str
    partition: str = "aws"

    @property
    def arn(self) -> str:
        return f"arn:{self.partition}:sts::{self.account}:assumed-role/{STACK_ROLE}/{self.session}"

    @property
    def role_arn(self) -> str:
        return f"arn:{self.partition}:iam::{self.account}:role/{STACK_ROLE}"

    @property
    def role_id(self) -> str:
        """A stable ``AROA...`` id of the stack role in this account (AWS's form: 21 characters)."""
        digest = hashlib.sha256(f"{self.account}/{STACK_ROLE}".encode()).hexdigest().upper()
        return f"AROA{digest[:17]}"

    @property
    def user_id(self) -> str:
        return f"{self.role_id}:{self.session}"


def caller_of(principal: Principal | None, account: str, partition: str = "aws") -> Caller:
    """The caller of a request signed by ``principal`` (``None``: the local identity)."""
    return Caller(account, principal.access_key if principal else LOCAL_SESSION, partition)


# ----- the actions, one function each -------------------------------------------------------------


def get_caller_identity(caller: Caller, _: dict[str, str]) -> str:
    fields = {"Arn": caller.arn, "UserId": caller.user_id, "Account": caller.account}
    return "".join(_element(name, text) for name, text in fields.items())


def get_role(caller: Caller, params: dict[str, str]) -> str:
    name = params.get("RoleName", "")
    if name != STACK_ROLE:
        raise QueryError(404, "NoSuchEntity", f"The role with name {name} cannot be found.")
    document = urllib.parse.quote(json.dumps(TRUST_POLICY, separators=(",", ":")))
    role = (
        _element("Path", "/")
        + _element("RoleName", STACK_ROLE)
        + _element("RoleId", caller.role_id)
        + _element("Arn", caller.role_arn)
        + _element("CreateDate", ROLE_CREATED)
        + _element("AssumeRolePolicyDocument", document)
        + _element("MaxSessionDuration", "3600")
    )
    return f"<Role>{role}</Role>"


Action = Callable[[Caller, dict[str, str]], str]
ACTIONS: dict[tuple[str, str], Action] = {
    ("sts", "GetCallerIdentity"): get_caller_identity,
    ("iam", "GetRole"): get_role,
}
"""The (service, action) pairs answered; every other IAM action is ``AccessDenied``."""


def dispatch(service: str, action: str, caller: Caller, params: dict[str, str]) -> str:
    """The ``<ActionResult>`` body of one request, or a ``QueryError``."""
    handler = ACTIONS.get((service, action))
    if handler is not None:
        return handler(caller, params)
    if service == "iam" and action:
        raise QueryError(
            403,
            "AccessDenied",
            f"User: {caller.arn} is not authorized to perform: iam:{action} "
            "(gpuquota has no IAM policies; it answers only iam:GetRole of its role)",
        )
    name, version = action or "(none)", params.get("Version")
    raise QueryError(400, "InvalidAction", f"Could not find operation {name} for version {version}")


# ----- the wire -----------------------------------------------------------------------------------


def parse_form(raw: bytes) -> dict[str, str]:
    """The form's parameters (the last of a repeated name); ``QueryError`` when it is not a form."""
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise QueryError(400, "MalformedQueryString", "The request body is not UTF-8") from None
    return dict(pairs)


def service_of(params: dict[str, str]) -> str:
    service = SERVICE_OF_VERSION.get(params.get("Version", ""))
    if service is None:
        versions = ", ".join(sorted(SERVICE_OF_VERSION))
        raise QueryError(400, "InvalidAction", f"Version must be one of {versions} (STS, IAM)")
    return service


def result_document(service: str, action: str, body: str, request_id: str) -> str:
    return (
        f'<{action}Response xmlns="{NAMESPACES[service]}"><{action}Result>{body}</{action}Result>'
        f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>"
    )


def error_document(service: str, error: ApiError, request_id: str) -> str:
    kind = "Receiver" if error.status >= 500 else "Sender"
    inner = _element("Type", kind) + _element("Code", error.code) + _element("Message", error.message)
    return (
        f'<ErrorResponse xmlns="{NAMESPACES[service]}"><Error>{inner}</Error>'
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    )


def _element(name: str, text: str) -> str:
    return f"<{name}>{escape(text)}</{name}>"


def _xml(document: str, status: int, request_id: str) -> web.Response:
    return web.Response(
        status=status,
        body=document.encode(),
        content_type="text/xml",
        headers={"x-amzn-RequestId": request_id},
    )


def as_query_error(exc: ApiError) -> ApiError:
    """A SigV4 failure under the query protocol's code; other errors as they are."""
    if isinstance(exc, AuthError) and type(exc) in AUTH_CODES:
        return QueryError(403, AUTH_CODES[type(exc)], exc.message)
    if isinstance(exc, AuthError) and exc.code == "InvalidSignatureException":
        return QueryError(403, "SignatureDoesNotMatch", exc.message)
    return exc


async def answer(
    request: web.Request, keyring: Keyring | None, clock: Clock, account: str, partition: str = "aws"
) -> web.Response:
    """The answer to one query-protocol request (``POST /``), as XML, errors included."""
    request_id = str(uuid.uuid4())
    service = "sts"
    try:
        if (request.content_length or 0) > MAX_QUERY_BYTES:
            raise QueryError(413, "RequestEntityTooLarge", f"A query is at most {MAX_QUERY_BYTES} bytes")
        raw = await request.read()  # kept by aiohttp: authenticate hashes the same bytes
        if len(raw) > MAX_QUERY_BYTES:
            raise QueryError(413, "RequestEntityTooLarge", f"A query is at most {MAX_QUERY_BYTES} bytes")
        params = parse_form(raw)
        service = service_of(params)
        principal = await authenticate(request, keyring, clock, SIGNING_SERVICES)
        caller = caller_of(principal, account, partition)
        action = params.get("Action", "")
        body = dispatch(service, action, caller, params)
    except ApiError as exc:
        error = as_query_error(exc)
        return _xml(error_document(service, error, request_id), error.status, request_id)
    return _xml(result_document(service, action, body, request_id), 200, request_id)


# ----- the client environment (``gpuquota env``) ----------------------------------------------------


def default_bucket(account: str, region: str) -> str:
    """The SageMaker SDK's default bucket name, ``sagemaker-<region>-<account>``."""
    return f"sagemaker-{region}-{account}"


def client_environment(
    account: str,
    region: str,
    authentication: bool,
    s3_endpoint: str | None,
    s3_key: tuple[str, str] | None = None,
) -> dict[str, object]:
    """What ``gpuquota env`` needs to know of this stack beyond the gateway's own URL: the account and
    region of its ARNs, whether requests must be signed, the S3 endpoint its node agents use
    (``None``: the stack names none, S3 is AWS's) and, for a stack without authentication that runs
    its own S3 server, that server's key pair (``s3Key``): boto3 signs every service with one key,
    and this gateway then takes any."""
    env: dict[str, object] = {
        "account": account,
        "region": region,
        "authentication": authentication,
        "defaultBucket": default_bucket(account, region),
        "endpoints": {"s3": s3_endpoint},
    }
    if s3_key is not None and not authentication:
        env["s3Key"] = {"accessKeyId": s3_key[0], "secretAccessKey": s3_key[1]}
    return env
