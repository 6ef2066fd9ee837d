"""The browser guard's rules one by one (``gpuquota.gateway.browser_guard``), over a real aiohttp server
with nothing behind the guard but an answer of 200: what passes, what each rule refuses and with which
status and AWS error shape. The same rules against a real ``gpuquota up``: test_browser_probes.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuquota.gateway import edge
from gpuquota.gateway.browser_guard import (
    CONSOLE_CSP,
    CONSOLE_TOKEN_HEADER,
    BrowserGuard,
    BrowserPolicy,
    name_of_host,
    normal_origin,
    own_origin,
)

JSON = {"Content-Type": "application/json"}


async def _ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"ok": True})


class Served:
    """One guard in front of a catch-all 200, listening on 127.0.0.1."""

    def __init__(self, server: TestServer, session: aiohttp.ClientSession, guard: BrowserGuard) -> None:
        self.server = server
        self.session = session
        self.guard = guard

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def send(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> tuple[int, Mapping[str, str], dict[str, object]]:
        sent = {"Host": self.host, **(headers or {})}
        async with self.session.request(
            method,
            self.server.make_url(path),
            headers=sent,
            data=body,
            skip_auto_headers=() if "Content-Type" in sent else ("Content-Type",),
        ) as response:
            return response.status, response.headers, await response.json()


async def _serve(guard: BrowserGuard) -> AsyncIterator[Served]:
    app = web.Application(middlewares=[guard.middleware, edge.errors])
    app.router.add_route("*", "/{tail:.*}", _ok)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield Served(server, session, guard)
    await server.close()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async for one in _serve(BrowserGuard("127.0.0.1")):
        yield one


# ----- the parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("localhost:8642", "localhost"),
        ("LOCALHOST.:8642", "localhost"),
        ("[::1]:8642", "::1"),
        ("[::1]", "::1"),
        ("evil.example", "evil.example"),
        ("evil.example:80x", None),
        ("evil.example:", None),
        ("[::1", None),
        ("[::1]x", None),
        ("::1", None),  # an IPv6 address without brackets is not a Host
        ("", None),
    ],
)
def test_name_of_host(host: str, name: str | None) -> None:
    assert name_of_host(host) == name


@pytest.mark.parametrize(
    ("origin", "normal"),
    [
        ("http://localhost:80", "http://localhost"),
        ("HTTPS://Proxy.Example:443", "https://proxy.example"),
        ("https://proxy.example:8443", "https://proxy.example:8443"),
        ("http://[::1]:8642", "http://[::1]:8642"),
        ("null", None),
        ("https://a.example/path", None),
        ("ftp://a.example", None),
        ("http://user@a.example", None),
    ],
)
def test_normal_origin(origin: str, normal: str | None) -> None:
    assert normal_origin(origin) == normal


def test_own_origin_is_the_requests_own_host() -> None:
    assert own_origin("http://127.0.0.1:8642", "127.0.0.1:8642")
    assert own_origin("https://g.example", "g.example:443")
    assert own_origin("http://g.example:80", "g.example")
    assert not own_origin("https://g.example", "g.example:80")
    assert not own_origin("http://evil.example:8642", "127.0.0.1:8642")
    assert not own_origin("null", "127.0.0.1:8642")


def test_policy_refuses_what_is_not_a_host_or_an_origin() -> None:
    policy = BrowserPolicy.parse(" gw.example, .corp.example ,*,", "https://Proxy.Example:443/")
    assert policy == BrowserPolicy(("gw.example", ".corp.example", "*"), ("https://proxy.example",))
    for hosts in ("http://gw.example", "gw.example/x", "a:b:c"):
        with pytest.raises(ValueError, match="GPUQUOTA_ALLOWED_HOSTS"):
            BrowserPolicy.parse(hosts, None)
    for origins in ("gw.example", "null", "https://gw.example/path"):
        with pytest.raises(ValueError, match="GPUQUOTA_ALLOWED_ORIGINS"):
            BrowserPolicy.parse(None, origins)


# ----- the host rule ------------------------------------------------------------------------------


def test_host_rule_of_a_loopback_bind() -> None:
    guard = BrowserGuard("127.0.0.1")
    for host in ("127.0.0.1:8642", "localhost:8642", "localhost", "[::1]:8642", "LocalHost.:1"):
        assert guard.host_allowed(host), host
    for host in ("evil.example:8642", "127.0.0.1.evil.example", "localhost.evil.example", "10.0.0.5:8642"):
        assert not guard.host_allowed(host), host


def test_host_rule_of_a_specific_address() -> None:
    guard = BrowserGuard("10.0.0.5")
    assert guard.host_allowed("10.0.0.5:8642") and guard.host_allowed("localhost:8642")
    assert not guard.host_allowed("10.0.0.6:8642")
    assert not guard.host_allowed(f"{socket.gethostname()}:8642")


def test_host_rule_of_a_wildcard_bind() -> None:
    """Bound to every address: every IP address and the machine's name are its own, names are not."""
    for bind in ("0.0.0.0", "::", "[::]"):
        guard = BrowserGuard(bind)
        for host in ("10.0.0.5:8642", "192.168.1.20", "[fe80::1]:8642", f"{socket.gethostname()}:8642"):
            assert guard.host_allowed(host), (bind, host)
        assert not guard.host_allowed("evil.example:8642"), bind


def test_host_rule_of_configured_names() -> None:
    guard = BrowserGuard("0.0.0.0", BrowserPolicy.parse("gpuquota-gateway,.corp.example", None))
    for host in ("gpuquota-gateway:8080", "corp.example", "gw.corp.example:443", "a.b.corp.example"):
        assert guard.host_allowed(host), host
    for host in ("gpuquota-gateway.evil.example", "evilcorp.example", "corp.example.evil"):
        assert not guard.host_allowed(host), host
    assert BrowserGuard("127.0.0.1", BrowserPolicy.parse("*", None)).host_allowed("evil.example:8642")


def test_host_verdicts_are_remembered_within_a_bound() -> None:
    guard = BrowserGuard("127.0.0.1")
    for i in range(2000):
        guard.host_allowed(f"rebind-{i}.evil.example")
    assert len(guard._verdicts) == 1024
    assert not guard.host_allowed("rebind-1999.evil.example")


async def test_a_foreign_host_is_misdirected(served: Served) -> None:
    status, headers, body = await served.send("GET", "/console/api/jobs", {"Host": "evil.example:8642"})
    assert status == 421
    assert headers["x-amzn-ErrorType"] == "MisdirectedRequestException"
    assert "evil.example" in str(body["message"])


# ----- the origin rule ----------------------------------------------------------------------------


async def test_a_foreign_origin_is_refused(served: Served) -> None:
    for origin in ("http://evil.example", "null", f"http://localhost:{served.server.port}"):
        status, headers, body = await served.send(
            "POST", "/v1/submitservicejob", {**JSON, "Origin": origin}, b"{}"
        )
        assert (status, headers["x-amzn-ErrorType"]) == (403, "AccessDeniedException"), origin
        assert origin in str(body["message"])
    status, _, _ = await served.send("GET", "/v1/tags/x", {"Origin": "http://evil.example"})
    assert status == 403  # reads too: a page of another origin gets nothing


async def test_the_own_origin_and_allowed_ones_pass(served: Served) -> None:
    own = f"http://{served.host}"
    status, _, _ = await served.send("POST", "/v1/listservicejobs", {**JSON, "Origin": own}, b"{}")
    assert status == 200
    async for other in _serve(BrowserGuard("127.0.0.1", BrowserPolicy.parse(None, "https://gw.example"))):
        status, _, _ = await other.send(
            "POST", "/v1/listservicejobs", {**JSON, "Origin": "https://GW.example:443"}, b"{}"
        )
        assert status == 200


# ----- the content-type rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain; application/json",  # a safelisted type whose parameters say JSON: still text
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        None,
    ],
)
async def test_a_post_that_is_not_json_is_unsupported(served: Served, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    status, sent, body = await served.send("POST", "/v1/submitservicejob", headers, b'{"jobName": "x"}')
    assert (status, sent["x-amzn-ErrorType"]) == (415, "UnsupportedMediaTypeException")
    assert "application/json" in str(body["message"])


async def test_json_posts_and_bodiless_reads_and_deletes_pass(served: Served) -> None:
    """What botocore sends: JSON for every POST (``{}`` at least), nothing for ListTagsForResource's GET
    and UntagResource's DELETE."""
    json_utf8 = {"Content-Type": "application/json; charset=utf-8"}
    assert (await served.send("POST", "/v1/listservicejobs", json_utf8, b"{}"))[0] == 200
    assert (await served.send("POST", "/gpuquota/v1/nodes/n/drain", JSON))[0] == 200  # no body
    assert (await served.send("GET", "/v1/tags/arn"))[0] == 200
    assert (await served.send("DELETE", "/v1/tags/arn?tagKeys=a"))[0] == 200
    assert (await served.send("DELETE", "/v1/tags/arn", {"Content-Type": "text/plain"}, b"x"))[0] == 415


async def test_the_content_type_is_refused_before_the_body_is_read(served: Served) -> None:
    """A text/plain POST whose body never comes is answered at once, not after BODY_READ_SECONDS."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    writer.write(
        f"POST /v1/submitservicejob HTTP/1.1\r\nHost: {served.host}\r\nContent-Type: text/plain\r\n"
        "Content-Length: 1000\r\n\r\n{".encode()
    )
    await writer.drain()
    started = asyncio.get_running_loop().time()
    answer = await asyncio.wait_for(reader.read(4096), timeout=edge.BODY_READ_SECONDS / 2)
    assert answer.startswith(b"HTTP/1.1 415"), answer
    assert asyncio.get_running_loop().time() - started < edge.BODY_READ_SECONDS / 2
    writer.close()
    await writer.wait_closed()


# ----- the console token rule and the headers -----------------------------------------------------


async def test_console_changes_need_the_token(served: Served) -> None:
    path = "/console/api/jobs/j/priority"
    for token in (None, "", "wrong", served.guard.console_token + "x"):
        headers = {**JSON, **({} if token is None else {CONSOLE_TOKEN_HEADER: token})}
        status, _, body = await served.send("POST", path, headers, b'{"priority": 3}')
        assert status == 403, token
        assert CONSOLE_TOKEN_HEADER in str(body["message"])
    headers = {**JSON, CONSOLE_TOKEN_HEADER: served.guard.console_token}
    assert (await served.send("POST", path, headers, b'{"priority": 3}'))[0] == 200
    assert (await served.send("GET", "/console/api/jobs"))[0] == 200  # reads need no token
    assert BrowserGuard().console_token != served.guard.console_token  # one per guard (process)


async def test_every_answer_has_the_security_headers(served: Served) -> None:
    for path, status in (("/v1/listservicejobs", 200), ("/v1/submitservicejob", 415)):
        _, headers, _ = await served.send("POST", path, JSON if status == 200 else {}, b"{}")
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert "Content-Security-Policy" not in headers
    _, headers, _ = await served.send("GET", "/console/api/overview")
    assert headers["Content-Security-Policy"] == CONSOLE_CSP
    assert "'unsafe-inline'" not in CONSOLE_CSP and "frame-ancestors 'none'" in CONSOLE_CSP
