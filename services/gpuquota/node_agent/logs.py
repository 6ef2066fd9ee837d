"""The HTTP server that serves a node's attempt logs to the gateway in distributed mode
(``gpuquota node-agent --logs-port``); where they are and how to read a piece of one is
``gpuquota.adapters.attempt_logs``.

An attempt's stdout and stderr go to ``WORK_DIR/logs/<attempt id>.log`` (the agent's ``LaunchSpec``).
The gateway reads them by byte offset, so ``gpuquota jobs logs --follow`` polls for what was added. In
embedded mode the gateway opens the file itself; in distributed mode it asks the node's log server,
``GET /logs/{attempt id}?offset=N&limit=M``, which answers the bytes (404: no such log yet).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gpuquota.adapters.attempt_logs import MAX_CHUNK, log_path, read_log
from gpuquota.httpserver import HttpServer

__all__ = ["MAX_CHUNK", "LogServer", "log_path", "read_log"]


class LogServer(HttpServer):
    """Serves the attempt logs of one node's work directory over HTTP (read-only, no authentication:
    bind it to an address only the gateway reaches)."""

    def __init__(self, work_dir: Path, host: str = "0.0.0.0", port: int = 8643) -> None:
        super().__init__(host, port)
        self.work_dir = Path(work_dir)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/logs/{attempt}", self._log)
        return app

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
