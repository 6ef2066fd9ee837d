"""Who may reach a listener: the loopback rule, and the node token of the node agents' log servers.

Theory of operation
-------------------
A gpuquota listener that runs commands (the gateway's API) or hands out what they printed (a node
agent's log server) must not be open to whoever reaches its port. The **loopback rule**: a listener
bound to a *loopback* address (``127.0.0.0/8``, ``::1`` or ``localhost``) may run without credentials,
since only this host reaches it; bound to any other address (``0.0.0.0``, ``::``, a host name, an
interface's address) it needs credentials, or the operator's explicit ``--allow-unauthenticated``
(``GPUQUOTA_ALLOW_UNAUTHENTICATED=1``), which :func:`check_exposure` then logs as a warning at start.
Without either it raises :class:`Exposed`, whose message says how to give credentials and how to
override; the entry points print it as one line and exit 2 (a configuration error), before they
connect to Kafka or PostgreSQL.

The gateway's credentials are its SigV4 keys (``gpuquota.gateway.auth``). A node agent's log server's
are the **node token**: one shared secret that the gateway sends as ``Authorization: Bearer <token>``
and the log server compares in constant time (:func:`bearer_matches`). It is read from a file
(``GPUQUOTA_NODE_TOKEN_FILE``, a mounted Secret: the way that keeps it out of the process environment)
or given as ``GPUQUOTA_NODE_TOKEN``; :func:`read_token` takes either, never both.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Mapping
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

log = logging.getLogger(__name__)

ALLOW_FLAG = "--allow-unauthenticated"
ALLOW_ENV = "GPUQUOTA_ALLOW_UNAUTHENTICATED"
TOKEN_ENV = "GPUQUOTA_NODE_TOKEN"
TOKEN_FILE_ENV = "GPUQUOTA_NODE_TOKEN_FILE"
MIN_TOKEN_LENGTH = 16
"""A node token shorter than this is refused: it would be guessed (``openssl rand -hex 32`` makes one)."""


class Exposed(ValueError):
    """A listener off loopback without credentials and without the override; the message says what to do."""


class TokenError(ValueError):
    """The node token is unreadable, too short, or given twice; the message never holds the token."""


def is_loopback(host: str) -> bool:
    """Whether only this host reaches ``host``: ``localhost``, ``127.0.0.0/8`` or ``::1``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve to anything
        return False


def allowed_by_env(environ: Mapping[str, str]) -> bool:
    """``GPUQUOTA_ALLOW_UNAUTHENTICATED`` as the settings classes read a boolean (``1``, ``true``, ``yes``,
    ``on``; unset: false), for ``gpuquota up``, which reads no settings class. Raises ``ValueError``."""
    raw = environ.get(ALLOW_ENV, "")
    if not raw:
        return False
    try:
        return TypeAdapter(bool).validate_python(raw)
    except ValidationError:
        raise ValueError(f"{ALLOW_ENV}: expected 1 or 0, true or false (got {raw!r})") from None


def check_exposure(what: str, host: str, credentials: bool, allow: bool, give: str) -> None:
    """The loopback rule for ``what`` bound to ``host``: pass, warn (``allow``), or raise :class:`Exposed`.

    ``give`` says how to configure credentials (``--auth-keys FILE or GPUQUOTA_AUTH_KEYS``).
    """
    if credentials or is_loopback(host):
        return
    if allow:
        log.warning(
            "serving %s on %s without authentication (%s): anyone who reaches the port may use it",
            what,
            host,
            ALLOW_FLAG,
        )
        return
    raise Exposed(
        f"refusing to serve {what} on {host} without authentication: give {give}, bind to 127.0.0.1, "
        f"or pass {ALLOW_FLAG} ({ALLOW_ENV}=1) to accept anyone who reaches the port"
    )


def read_token(value: str, file: Path | None) -> str | None:
    """The node token from ``GPUQUOTA_NODE_TOKEN`` (``value``) or ``GPUQUOTA_NODE_TOKEN_FILE``; ``None``
    when neither is set. Raises :class:`TokenError`."""
    if value and file is not None:
        raise TokenError(f"set {TOKEN_ENV} or {TOKEN_FILE_ENV}, not both")
    if file is not None:
        try:
            value = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise TokenError(f"cannot read the node token file {file}: {reason}") from None
    elif not value:
        return None
    token = value.strip()  # a file written by echo ends in a newline
    if len(token) < MIN_TOKEN_LENGTH:
        source = str(file) if file is not None else TOKEN_ENV
        raise TokenError(f"the node token ({source}) must be at least {MIN_TOKEN_LENGTH} characters")
    return token


def bearer(token: str) -> dict[str, str]:
    """The header the gateway sends a node's log server."""
    return {"Authorization": f"Bearer {token}"}


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token``, compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())
