"""The browser guard (issue #27): no web page the user visits can drive the gateway.

Theory of operation
-------------------
A scheduler runs the commands it is given, so an API that any web page can reach is a remote-execution
service. "Listening on 127.0.0.1 only" does not keep browsers out: a page on any site can send requests to
``http://127.0.0.1:8642`` from the user's own machine. It has three ways to do harm, and one rule each
stops it; the rules run in this order, on every request, before its body is read (``BrowserGuard.check``):

1. **Host rule** (421 Misdirected Request). *DNS rebinding*: a page of ``http://evil.example:8642``
   whose name the attacker then points at 127.0.0.1 is, for the browser, same-origin with the gateway:
   it may read every answer. Its requests still say ``Host: evil.example:8642``. The *allowed hosts*
   are the bind address, ``localhost``/``127.0.0.1``/``[::1]``, and the names configured
   (``GPUQUOTA_ALLOWED_HOSTS``: exact names, ``.example.com`` for a domain and its subdomains, ``*``
   for any name). Bound to a wildcard address (``0.0.0.0``, ``::``) the gateway answers on every
   address of the machine, so any IP address and the machine's host name are allowed too: rebinding
   needs a name the attacker controls, and an IP address names no one's page but the gateway's own.
   The port of ``Host`` is checked for form but not compared: rebinding changes the name, not the
   port, and a proxy in front may listen on another port.
2. **Origin rule** (403). *Cross-site requests*: a page's ``fetch`` carries the ``Origin`` header of
   the page (browsers send it on every cross-origin request and every POST). A request whose
   ``Origin`` is neither the *own origin* (the scheme and the ``Host`` of the request itself) nor one
   of the *allowed origins* (``GPUQUOTA_ALLOWED_ORIGINS``, e.g. the public address of a proxy that
   rewrites ``Host``) is refused. The gateway sends no CORS headers: an allowed origin's page can send
   requests, and read answers only if the browser sees it as same-origin (a proxy).
3. **Content-type rule** (415). *Simple requests*: a page may send a POST without the ``Origin``
   check ever applying on older browsers, and with ``mode: "no-cors"`` a browser sends it without
   asking the server first (no CORS preflight) as long as its content type is ``text/plain``, a form
   encoding or none. Every POST and every request with a body must say ``application/json``, which
   is what botocore sends for every REST-JSON operation with a body (all of Batch's POSTs, including
   an empty ``{}``); a browser sends that only after a preflight, which the gateway never answers with
   permission. Bodiless ``GET``/``DELETE`` (botocore's ``ListTagsForResource``/``UntagResource``) do
   not need it: a page cannot send a cross-origin ``DELETE`` without a preflight, and a ``GET`` it
   sends changes nothing and cannot be read back. One exception, the *query route*: ``POST /`` with
   ``application/x-www-form-urlencoded`` is AWS's query protocol, which botocore uses for STS and
   IAM (the SageMaker SDK asks who it is, ``gpuquota.gateway.identity``). A page can send such a form
   without a preflight, so the route is safe by what it does: it only reads (the caller's identity,
   one fixed role), changes nothing, and its answer is not readable by another origin; rules 1 and 2
   still apply to it, and it answers every other action with an error.
4. **Console token rule** (403). The console (``/console/``) is a page of the gateway itself, so
   it passes rules 1 to 3. Its changes (``POST /console/api/...``) must also carry the *console
   token*, a random value made once per process, in the header ``X-Gpuquota-Console-Token``. The token
   is written into the console's ``index.html`` (a ``<meta>`` element): only a page that can read the
   gateway's answers can know it, which rules 1 and 2 keep to pages served by the gateway. It is not
   served by an endpoint of its own because that would be one more answer to guard, for no gain; a
   custom header also cannot be sent by a form or a no-cors request.

Every answer also says ``X-Content-Type-Options: nosniff`` (no JSON answer is ever run as a script or
shown as HTML), ``X-Frame-Options: DENY`` and ``Referrer-Policy: no-referrer``; the console's answers add
a strict ``Content-Security-Policy`` (only the gateway's own script and style sheet, no inline script or
style, no framing).

What it does not protect against: anything that is not a browser. A local user, a process on the
machine, or a neighbour on the network when the gateway is bound beyond loopback sends whatever headers
it likes; authentication (``docs/authentication.md``) is what stops those.

Cost: the allowed sets are built once; a request of an AWS SDK (no ``Origin``, a known ``Host``) costs
a dictionary lookup for its ``Host``, two header lookups and a comparison.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from gpuquota.gateway.edge import error_response
from gpuquota.gateway.errors import ApiError

ALLOWED_HOSTS_ENV = "GPUQUOTA_ALLOWED_HOSTS"
ALLOWED_ORIGINS_ENV = "GPUQUOTA_ALLOWED_ORIGINS"
CONSOLE_TOKEN_HEADER = "X-Gpuquota-Console-Token"
CONSOLE_PREFIX = "/console/"
CONSOLE_CHANGES = "/console/api/"
"""Under this prefix a POST is a console change (priority, terminate): it needs the console token."""
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
QUERY_PATH = "/"
"""The query route (STS, IAM): a form POST to it is exempt from the content-type rule only."""
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
DEFAULT_PORTS = {"http": "80", "https": "443"}
MAX_REMEMBERED_HOSTS = 1024
"""Distinct ``Host`` values whose verdict is kept (a client sending random ones cannot grow it)."""

COMMON_HEADERS: Mapping[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
CONSOLE_HEADERS: Mapping[str, str] = {**COMMON_HEADERS, "Content-Security-Policy": CONSOLE_CSP}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MisdirectedRequest(ApiError):
    """HTTP 421: the ``Host`` names a server this gateway is not (DNS rebinding, the host rule)."""

    status = 421
    code = "MisdirectedRequestException"


class ForeignOrigin(ApiError):
    """HTTP 403: sent by a page of another origin (the origin rule) or without the console token."""

    status = 403
    code = "AccessDeniedException"


class UnsupportedMediaType(ApiError):
    """HTTP 415: a POST or a body that is not ``application/json`` (the content-type rule)."""

    status = 415
    code = "UnsupportedMediaTypeException"


@dataclass(frozen=True)
class BrowserPolicy:
    """What an operator allows beyond the defaults: host names and origins, as configured."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    @classmethod
    def parse(cls, hosts: str | None, origins: str | None) -> BrowserPolicy:
        """From the comma-separated settings; ``ValueError`` names an entry that is not one."""
        return cls(
            tuple(_host_entry(entry) for entry in _entries(hosts)),
            tuple(_origin_entry(entry) for entry in _entries(origins)),
        )


def _entries(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _host_entry(entry: str) -> str:
    text = entry.lower()
    if text == "*":
        return text
    name = name_of_host(text.removeprefix("."))
    if name is None or "/" in text or "@" in text:
        raise ValueError(f"{ALLOWED_HOSTS_ENV}: {entry!r} is not a host name (example.com, .example.com, *)")
    return f".{name}" if text.startswith(".") else name


def _origin_entry(entry: str) -> str:
    origin = normal_origin(entry.rstrip("/"))
    if origin is None:
        raise ValueError(f"{ALLOWED_ORIGINS_ENV}: {entry!r} is not an origin (https://host[:port])")
    return origin


def add_browser_flags(parser: argparse.ArgumentParser) -> None:
    """The ``--allowed-hosts`` and ``--allowed-origins`` flags of ``gpuquota up`` and ``gpuquota gateway``."""
    parser.add_argument(
        "--allowed-hosts",
        metavar="NAMES",
        default=None,
        help=f"host names the API answers to besides the bind address and localhost, comma-separated: "
        f"example.com, .example.com (and subdomains), * (any) ({ALLOWED_HOSTS_ENV})",
    )
    parser.add_argument(
        "--allowed-origins",
        metavar="ORIGINS",
        default=None,
        help=f"web origins whose pages may call the API, comma-separated, e.g. https://gpuquota.example.com "
        f"(a proxy's address) ({ALLOWED_ORIGINS_ENV}; default: only the gateway's own)",
    )


# ----- the rules, one function each ----------------------------------------------------------------


def name_of_host(host: str) -> str | None:
    """The name in a ``Host`` value, lower case, without its port or final dot; ``None`` when the value
    is malformed (a port that is not a number, an unclosed ``[``, a bare IPv6 address)."""
    host = host.lower()
    if host.startswith("["):
        name, sep, rest = host[1:].partition("]")
        if not sep or (rest and not _is_port(rest)):
            return None
    else:
        name, sep, port = host.partition(":")
        if sep and not (port.isdigit() and len(port) <= 5):
            return None
    name = name.removesuffix(".")
    return name or None


def _is_port(text: str) -> bool:
    return text.startswith(":") and text[1:].isdigit() and len(text) <= 6


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def normal_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case without the scheme's default port; ``None`` when
    ``origin`` is not an http(s) origin (``null``, a path, another scheme)."""
    scheme, sep, authority = origin.lower().partition("://")
    default = DEFAULT_PORTS.get(scheme)
    if not sep or default is None or not authority or "/" in authority or "@" in authority:
        return None
    if name_of_host(authority) is None:
        return None
    return f"{scheme}://{authority.removesuffix(':' + default)}"


def own_origin(origin: str, host: str) -> bool:
    """Whether ``origin`` is the gateway's own as the request names it: same scheme-less authority as
    its ``Host`` (either may leave out the scheme's default port)."""
    normal = normal_origin(origin)
    if normal is None:
        return False
    scheme, _, authority = normal.partition("://")
    return authority == host.lower().removesuffix(":" + DEFAULT_PORTS[scheme])


def needs_json(request: web.Request) -> bool:
    """The content-type rule applies: a POST, or any request with a body, but for a form POST to
    the query route (read-only: see rule 3)."""
    if is_query(request):
        return False
    return request.method == "POST" or request.body_exists


def is_query(request: web.Request) -> bool:
    return request.method == "POST" and request.path == QUERY_PATH and request.content_type == FORM


def is_console_change(request: web.Request) -> bool:
    return request.method == "POST" and request.path.startswith(CONSOLE_CHANGES)


# ----- the guard -----------------------------------------------------------------------------------


class BrowserGuard:
    """The four rules for a gateway bound to ``bind_host``, as an aiohttp middleware (:meth:`middleware`)."""

    def __init__(self, bind_host: str = "127.0.0.1", policy: BrowserPolicy | None = None) -> None:
        policy = policy or BrowserPolicy()
        bind = bind_host.strip("[]").lower()  # an address or a name, without a port
        self.any_address = bind in WILDCARD_BINDS
        names = set(LOOPBACK_NAMES)
        names.add(socket.gethostname().lower() if self.any_address else bind)
        self.any_name = "*" in policy.allowed_hosts
        self.names = frozenset(names | {h for h in policy.allowed_hosts if not h.startswith(".")})
        self.domains = tuple(h for h in policy.allowed_hosts if h.startswith(".") and h != "*")
        self.origins = frozenset(policy.allowed_origins)
        self.console_token = secrets.token_urlsafe(32)
        self._verdicts: dict[str, bool] = {}

    # ----- the host rule ---------------------------------------------------------------------------

    def host_allowed(self, host: str) -> bool:
        """The host rule for one ``Host`` value, remembered (a client sends the same one every time)."""
        verdict = self._verdicts.get(host)
        if verdict is None:
            verdict = self._decide_host(host)
            if len(self._verdicts) < MAX_REMEMBERED_HOSTS:
                self._verdicts[host] = verdict
        return verdict

    def _decide_host(self, host: str) -> bool:
        name = name_of_host(host)
        if name is None:
            return False
        return (
            self.any_name
            or name in self.names
            or any(name == d[1:] or name.endswith(d) for d in self.domains)
            or (self.any_address and _is_address(name))
        )

    # ----- all rules -------------------------------------------------------------------------------

    def check(self, request: web.Request) -> None:
        """Raise the error of the first rule ``request`` breaks."""
        headers = request.headers
        host = headers.get("Host")
        # HTTP/1.1 requires Host and every browser sends it; a request without one is no browser's
        if host is not None and not self.host_allowed(host):
            raise MisdirectedRequest(
                f"This gateway does not serve the host {host!r} (see {ALLOWED_HOSTS_ENV})"
            )
        origin = headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin, host):
            raise ForeignOrigin(
                f"Requests from pages of {origin!r} are not allowed (see {ALLOWED_ORIGINS_ENV})"
            )
        if needs_json(request) and request.content_type != JSON:
            raise UnsupportedMediaType(
                f"The request must have Content-Type: {JSON}, not {headers.get('Content-Type', 'none')!r}"
            )
        if is_console_change(request) and not self.token_matches(headers.get(CONSOLE_TOKEN_HEADER)):
            raise ForeignOrigin(f"Console changes need the console's token ({CONSOLE_TOKEN_HEADER})")

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        if host is not None and own_origin(origin, host):
            return True
        normal = normal_origin(origin)
        return normal is not None and normal in self.origins

    def token_matches(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.console_token.encode())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Check, then answer with the security headers (the console's with its CSP)."""
        try:
            self.check(request)
        except ApiError as exc:
            response: web.StreamResponse = error_response(exc)
        else:
            response = await handler(request)
        console = request.path.startswith(CONSOLE_PREFIX)
        response.headers.update(CONSOLE_HEADERS if console else COMMON_HEADERS)
        return response
