"""The HTTP server that serves a node's attempt logs to the gateway in distributed mode
(``gpuquota node-agent --logs-port``); where they are and how to read a piece of one is
``gpuquota.adapters.attempt_logs``.

An attempt's stdout and stderr go to ``WORK_DIR/logs/<attempt id>.log`` (the agent's ``LaunchSpec``).
The gateway reads them by byte offset, so ``gpuquota jobs logs --follow`` polls for what was added. In
embedded mode the gateway opens the file itself; in distributed mode it asks the node's log server,
``GET /logs/{attempt id}?offset=N&limit=M``, which answers the bytes (404: no such log yet).

Every job's output is readable there, so the server follows the loopback rule (``gpuquota.support.exposure``):
given the node token it answers only requests that carry ``Authorization: Bearer <token>`` (401
otherwise, before the path is looked at); bound off loopback without a token the agent refuses to
start unless ``--allow-unauthenticated``. A node agent's ``--metrics-port`` serves no logs.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from gpuquota.adapters.attempt_logs import MAX_CHUNK, log_path, read_log
from gpuquota.support.exposure import bearer_matches
from gpuquota.support.httpserver import HttpServer

__all__ = ["MAX_CHUNK", "LogServer", "log_path", "read_log"]


class LogServer(HttpServer):
    """Serves the attempt logs of one node's work directory over HTTP (read-only); with ``token``, only to
    requests that carry it as a bearer token."""

    def __init__(
        self, work_dir: Path, host: str = "127.0.0.1", port: int = 8643, token: str | None = None
    ) -> None:
        super().__init__(host, port)
        self.work_dir = Path(work_dir)
        self.token = token

    def app(self) -> web.Application:
        app = web.Application(middlewares=[] if self.token is None else [self._authorized])
        app.router.add_get("/logs/{attempt}", self._log)
        return app

    @web.middleware
    async def _authorized(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        assert self.token is not None
        if not bearer_matches(request.headers.get("Authorization"), self.token):
            raise web.HTTPUnauthorized(text="node token required", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def start(self) -> None:
        await self.serve(self.app())

    async def _log(self, request: web.Request) -> web.Response:
        try:
            offset = int(request.query.get("offset", "0"))
            limit = int(request.query.get("limit", str(MAX_CHUNK)))
        except ValueError:
            raise web.HTTPBadRequest(text="offset and limit must be integers") from None
        data = read_log(log_path(self.work_dir, request.match_info["attempt"]), offset, limit)
        if data is None:
            raise web.HTTPNotFound(text="no such log")
        return web.Response(body=data, content_type="application/octet-stream")
