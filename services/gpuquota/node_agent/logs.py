"""Attempt logs on a node: where they are, how to read a piece of one, and the HTTP server that
serves them to the gateway in distributed mode (``gpuquota node-agent --logs-port``).

An attempt's stdout and stderr go to ``WORK_DIR/logs/<attempt id>.log`` (the agent's ``LaunchSpec``).
The gateway reads them by byte offset, so ``gpuquota jobs logs --follow`` polls for what was added. In
embedded mode the gateway opens the file itself; in distributed mode it asks the node's log server,
``GET /logs/{attempt id}?offset=N&limit=M``, which answers the bytes (404: no such log yet).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gpuquota.httpserver import HttpServer
from gpuquota.node_agent.prepare import safe_name as _safe

MAX_CHUNK = 256 * 1024
"""The most bytes one read returns."""


def log_path(work_dir: Path, attempt_id: str) -> Path:
    return Path(work_dir) / "logs" / f"{_safe(attempt_id)}.log"


def read_log(path: Path, offset: int, limit: int = MAX_CHUNK) -> bytes | None:
    """At most ``limit`` bytes of ``path`` from ``offset``; ``None`` when the file does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, offset))
            return f.read(max(0, min(limit, MAX_CHUNK)))
    except FileNotFoundError:
        return None


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
