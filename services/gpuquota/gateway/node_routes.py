"""gpuquota's node endpoints (not AWS): ``gpuquota nodes`` and ``gpuquota jobs logs``.

- ``GET /gpuquota/v1/nodes`` lists the read model's nodes (``gpuquota.read.nodes``).
- ``POST /gpuquota/v1/nodes/{node}/drain`` and ``.../undrain`` send ``DrainNode`` / ``UndrainNode``
  to the scheduler: a draining node gets no new dispatches and its running attempts finish.
- ``GET /gpuquota/v1/jobs/{job}/logs?attempt=N&offset=K`` answers a piece of an attempt's log,
  read from its node by a :class:`LogReader`: :class:`LocalLogs` opens the node's file (embedded
  mode, where the agents share the gateway's disk), :class:`HttpLogs` asks the node agent's log
  server (distributed mode, ``gpuquota.node_agent.logs``) at the URL ``GPUQUOTA_NODE_LOGS_URL``
  makes of the node's id (``{node_id}``) or of the address it advertised when it registered
  (``{address}``: the pod IP on Kubernetes, where a node id names no pod).

Install with ``NodeRoutes(gateway, logs).install()`` before ``gateway.app()``.
"""

from __future__ import annotations

import codecs
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from gpuquota.adapters.attempt_logs import MAX_CHUNK, log_path, read_log
from gpuquota.gateway.access import check_job, denied
from gpuquota.gateway.app import Gateway
from gpuquota.gateway.edge import json_response as _json
from gpuquota.gateway.errors import ClientException
from gpuquota.read.nodes import ACTIVE, ActiveAttempt
from gpuquota.support.exposure import TOKEN_FILE_ENV, bearer
from gpuquota.wire import inputs as inp

NODE_LOGS_TIMEOUT = 10.0


class LogReader(Protocol):
    async def read(
        self, node_id: str, attempt_id: str, offset: int, limit: int, *, address: str = ""
    ) -> bytes | None:
        """At most ``limit`` bytes of the attempt's log from ``offset``; ``None`` if there is none.
        ``address``: the node's advertised address (empty when it advertised none)."""
        ...


class LocalLogs:
    """Logs of node agents that run next to the gateway: ``work_dir(node_id)`` is a node's directory."""

    def __init__(self, work_dir: Callable[[str], Path | None]) -> None:
        self.work_dir = work_dir

    async def read(
        self, node_id: str, attempt_id: str, offset: int, limit: int, *, address: str = ""
    ) -> bytes | None:
        directory = self.work_dir(node_id)
        return None if directory is None else read_log(log_path(directory, attempt_id), offset, limit)


class HttpLogs:
    """Logs served by each node agent's log server; ``url`` names it, e.g. ``http://{node_id}:8643`` or
    ``http://{address}:8643``; ``token``, the node token (``gpuquota.support.exposure``), is sent as a bearer
    token. ``GatewaySettings`` refuses a template with other fields at start."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.headers = {} if token is None else bearer(token)

    def base(self, node_id: str, address: str) -> str:
        """The node's log server; a node that advertised no address is named by its id."""
        return self.url.format(node_id=node_id, address=address or node_id).rstrip("/")

    async def read(
        self, node_id: str, attempt_id: str, offset: int, limit: int, *, address: str = ""
    ) -> bytes | None:
        base = self.base(node_id, address)
        url = f"{base}/logs/{urllib.parse.quote(attempt_id, safe='')}"
        timeout = aiohttp.ClientTimeout(total=NODE_LOGS_TIMEOUT)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, headers=self.headers) as session,
                session.get(url, params={"offset": str(offset), "limit": str(limit)}) as response,
            ):
                if response.status == 404:
                    return None
                if response.status in (401, 403):
                    raise ClientException(
                        f"node {node_id} at {base} refused the gateway's node token "
                        f"({'none given' if not self.headers else 'not the one it holds'}): "
                        f"set the same {TOKEN_FILE_ENV} on both"
                    )
                response.raise_for_status()
                return await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ClientException(
                f"cannot read the log from node {node_id} at {base}: {exc or 'timeout'}"
            ) from None


def complete_text(data: bytes, final: bool) -> tuple[str, int]:
    """``data`` as text, and how many bytes that is: an incomplete UTF-8 character at the end is left for
    the next read unless ``final``."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=final)
    pending = len(decoder.getstate()[0])
    return text, len(data) - pending


class NodeRoutes:
    def __init__(self, gateway: Gateway, logs: LogReader | None = None) -> None:
        self.gateway = gateway
        self.logs = logs

    def install(self) -> None:
        self.gateway.route_hooks.append(self.add_routes)

    def add_routes(self, app: web.Application) -> None:
        router = app.router
        router.add_get("/gpuquota/v1/nodes", self._list)
        router.add_post("/gpuquota/v1/nodes/{node}/drain", self._drain)
        router.add_post("/gpuquota/v1/nodes/{node}/undrain", self._undrain)
        router.add_get("/gpuquota/v1/jobs/{job:.+}/logs", self._logs)

    # ----- nodes -------------------------------------------------------------------------------

    def _active(self) -> Iterator[ActiveAttempt]:
        for job in self.gateway.rm.jobs.values():
            if job.status in ACTIVE and job.current is not None:
                yield job.job_id, job.job_name, job.status, job.current.attempt_id

    def nodes(self) -> dict[str, Any]:
        rows = self.gateway.rm.nodes.describe(self._active(), self.gateway.clock())
        return {"nodes": rows}

    async def _admin(self, request: web.Request, action: str) -> None:
        principal = await self.gateway.limited_principal(request)
        if principal is not None:
            raise denied(principal, action)

    async def _list(self, request: web.Request) -> web.Response:
        await self._admin(request, "gpuquota:ListNodes")
        return _json(self.nodes())

    async def _drain(self, request: web.Request) -> web.Response:
        await self._admin(request, "gpuquota:DrainNode")
        return _json(await self._set_draining(request.match_info["node"], drain=True))

    async def _undrain(self, request: web.Request) -> web.Response:
        await self._admin(request, "gpuquota:UndrainNode")
        return _json(await self._set_draining(request.match_info["node"], drain=False))

    async def _set_draining(self, node_id: str, drain: bool) -> dict[str, Any]:
        node = self.gateway.rm.nodes.nodes.get(node_id)
        if node is None or not node.online:
            raise ClientException(f"Node {node_id} is not registered")
        message: inp.DrainNode | inp.UndrainNode = (
            self.gateway.make(inp.DrainNode, node_id=node_id)
            if drain
            else self.gateway.make(inp.UndrainNode, node_id=node_id)
        )
        await self.gateway.send(message)
        return {"nodeId": node_id, "state": "DRAINING" if drain else "READY"}

    # ----- logs --------------------------------------------------------------------------------

    async def _logs(self, request: web.Request) -> web.Response:
        principal = await self.gateway.limited_principal(request)
        ref = urllib.parse.unquote(request.match_info["job"])
        if principal is not None:
            check_job(self.gateway, principal, "gpuquota:GetJobLogs", ref)
        return _json(await self.read_logs(ref, request.query.get("attempt"), request.query.get("offset")))

    async def read_logs(self, ref: str, attempt: str | None, offset: str | None) -> dict[str, Any]:
        job = self.gateway.job(ref)
        number = _integer("attempt", attempt, low=1) if attempt else len(job.attempts)
        start = _integer("offset", offset, low=0) if offset else 0
        out: dict[str, Any] = {"jobId": job.job_id, "status": job.status.value, "offset": start}
        if number == 0:
            if job.terminal:
                raise ClientException(f"Service job {job.job_id} ended ({job.status.value}) before it ran")
            return {**out, "attempt": None, "nextOffset": start, "text": "", "complete": False}
        if number > len(job.attempts):
            raise ClientException(
                f"Service job {job.job_id} has {len(job.attempts)} attempt(s), not {number}"
            )
        view = job.attempts[number - 1]
        nodes = self.gateway.rm.nodes.nodes_of(view.attempt_id)
        ended = view.stopped_at is not None or job.terminal
        data = b""
        if nodes and self.logs is not None:
            node = self.gateway.rm.nodes.nodes.get(nodes[0])
            address = "" if node is None else node.address
            data = await self.logs.read(nodes[0], view.attempt_id, start, MAX_CHUNK, address=address) or b""
        elif self.logs is None:
            raise ClientException("This gateway cannot read node logs (see docs/distributed.md)")
        final = ended and len(data) < MAX_CHUNK
        text, used = complete_text(data, final)
        out.update(attempt=number, attemptId=view.attempt_id, nodeId=nodes[0] if nodes else None)
        return {**out, "nextOffset": start + used, "text": text, "complete": final}


def _integer(name: str, value: str, low: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ClientException(f"{name} must be an integer") from None
    if number < low:
        raise ClientException(f"{name} must be at least {low}")
    return number
