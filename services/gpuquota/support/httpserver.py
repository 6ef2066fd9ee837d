"""One aiohttp application listening on ``host:port``: the small servers beside the gateway (a node's
log server, the scheduler's and agents' metrics and health port) start and stop the same way."""

from __future__ import annotations

from aiohttp import web


class HttpServer:
    """Start with :meth:`serve`; ``port`` 0 picks a free port, which ``port`` then holds."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def serve(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
