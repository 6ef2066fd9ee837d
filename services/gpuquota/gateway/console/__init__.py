"""The web console (I7) at ``/console/``: one HTML page, one vanilla JavaScript file and one style sheet,
served by the gateway (no build toolchain, nothing from a CDN), over a small JSON API read from the
gateway's read model and, for the nodes, the core's state.

The page polls the API every ``POLL_MS`` milliseconds (live updates). Its views: the quota shares of
each queue and unit as bars (limit, used, borrowed, lent, queued), the jobs with filters, a job with its
attempts as a timeline, its explanation and preemption history, and the nodes with their slots. With
authentication off it can change a job's priority and terminate it, through the same operations as
``UpdateServiceJob`` and ``TerminateServiceJob``; with authentication on the API refuses both (the
browser cannot sign requests), and the page shows no buttons. The reads are not signed: put the console
behind the network controls of the deployment when authentication is on.

Only the console's own page may change anything: ``index.html`` carries the gateway's console token
(``gpuquota.gateway.browser_guard``) in ``<meta name="gpuquota-console-token">``, and console.js sends
it with every change; the guard refuses changes without it. The page is served ``no-store``, so the
token stays out of caches, and the guard gives every console answer a strict Content-Security-Policy:
the page has no inline script or style (console.js sets the bars' geometry through the CSSOM).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from gpuquota.gateway.auth import AccessDenied
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params
from gpuquota.gateway.render import job_brief
from gpuquota.read.shares import share_maximum, share_table

if TYPE_CHECKING:
    from gpuquota.core.state import ClusterState
    from gpuquota.gateway.app import Gateway
    from gpuquota.read.jobs import JobView

STATIC = Path(__file__).parent / "static"
POLL_MS = 1000
MAX_JOBS = 500
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
TOKEN_PLACEHOLDER = b"{{console-token}}"


class Console:
    """The console's routes over one gateway (``state`` gives the core's state, for the nodes)."""

    def __init__(self, gateway: Gateway, state: Callable[[], ClusterState | None]) -> None:
        self.gateway = gateway
        self.state = state

    @property
    def read_only(self) -> bool:
        return self.gateway.auth is not None

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/console", self._redirect)
        router.add_get("/console/", self._page)
        router.add_get("/console/static/{name}", self._static)
        router.add_get("/console/api/overview", self._overview)
        router.add_get("/console/api/jobs", self._jobs)
        router.add_get("/console/api/jobs/{job}", self._job)
        router.add_post("/console/api/jobs/{job}/priority", self._priority)
        router.add_post("/console/api/jobs/{job}/terminate", self._terminate)
        router.add_get("/console/api/nodes", self._nodes)

    # ----- files -------------------------------------------------------------------------------

    async def _redirect(self, _: web.Request) -> web.Response:
        raise web.HTTPFound("/console/")

    async def _page(self, _: web.Request) -> web.Response:
        page = (STATIC / "index.html").read_bytes()
        token = self.gateway.guard.console_token.encode()  # URL-safe base64: nothing to escape in HTML
        return web.Response(
            body=page.replace(TOKEN_PLACEHOLDER, token),
            headers={"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store"},
        )

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise web.HTTPNotFound()
        return _file(path)

    # ----- reads -------------------------------------------------------------------------------

    async def _overview(self, _: web.Request) -> web.Response:
        rm = self.gateway.rm
        shares = []
        for row in share_table(rm):
            queued: dict[str, int] = {}
            for key in rm.runnable.get((row["jobQueue"], row["quotaShareName"]), ()):
                job = rm.jobs.get(key[2])
                if job is not None:
                    queued[job.unit] = queued.get(job.unit, 0) + 1
            units = sorted({*row["limits"], *row["usage"], *queued})
            maximum = {u: share_maximum(rm, row["jobQueue"], row["quotaShareName"], u) for u in units}
            shares.append(
                {
                    **row,
                    "units": units,
                    "queued": queued,
                    "maximum": maximum,
                    "planned": rm.plans.allocated(row["jobQueue"], row["quotaShareName"]),
                }
            )
        return _json(
            {
                "readOnly": self.read_only,
                "pollMs": POLL_MS,
                "shares": shares,
                "pools": self._pools(),
                "plans": rm.plans.describe(self.gateway.clock()),
            }
        )

    def _pools(self) -> list[dict[str, Any]]:
        state = self.state()
        if state is None:
            return []
        return [
            {"pool": pool, "unit": unit, "slots": slots, "free": state.pool_free.get(pool, {}).get(unit, 0)}
            for pool, units in sorted(state.pool_slots.items())
            for unit, slots in sorted(units.items())
        ]

    async def _jobs(self, request: web.Request) -> web.Response:
        """Jobs, newest first, filtered by ``queue``, ``share``, ``status`` and ``name`` (a prefix)."""
        query = request.query
        queue, share = query.get("queue") or None, query.get("share") or None
        status, name = query.get("status") or None, (query.get("name") or "").lower()
        rows = []
        # newest first without sorting them all: the read model keeps jobs in the order they arrived
        for job in reversed(self.gateway.rm.jobs.values()):
            if (
                (queue is not None and job.job_queue != queue)
                or (share is not None and job.quota_share != share)
                or (status is not None and job.status.value != status)
                or (name and not job.job_name.lower().startswith(name))
            ):
                continue
            rows.append(self._summary(job))
            if len(rows) >= MAX_JOBS:
                break
        return _json({"jobs": rows, "readOnly": self.read_only})

    def _summary(self, job: JobView) -> dict[str, Any]:
        return {
            **job_brief(job),
            "unit": job.unit,
            "count": job.count,
            "createdAt": job.created_at,
            "preemptedAttemptCount": job.preempted_count,
        }

    async def _job(self, request: web.Request) -> web.Response:
        ref = unquote(request.match_info["job"])
        explained = await self.gateway.explain(ref)
        job = self.gateway.rm.jobs[explained["jobId"]]
        attempts = [
            {
                "attemptId": a.attempt_id,
                "scheduledAt": a.scheduled_at,
                "startedAt": a.started_at,
                "stoppedAt": a.stopped_at,
                "statusReason": a.status_reason,
            }
            for a in job.attempts
        ]
        return _json(
            {
                **explained,
                "summary": self._summary(job),
                "createdAt": job.created_at,
                "attempts": attempts,
                "planWindows": self._plan_windows(job),
                "now": self.gateway.clock(),
                "readOnly": self.read_only,
            }
        )

    def _plan_windows(self, job: JobView) -> list[dict[str, Any]]:
        """Training plans' windows for the job's unit in its environment, from its creation to a day
        ahead (S11: the timeline shades those it covers; a waiting job's next window is among them)."""
        rm = self.gateway.rm
        queue = rm.queues.get(job.job_queue)
        if queue is None:
            return []
        end = max(self.gateway.clock(), job.created_at) + PLAN_LOOKAHEAD_MS
        return rm.plans.windows_of(queue.spec.service_environment, job.unit, job.created_at, end)

    async def _nodes(self, _: web.Request) -> web.Response:
        state = self.state()
        if state is None:
            return _json({"nodes": []})
        holders: dict[tuple[str, int], str] = {}
        for record in state.shares.values():
            for job_ids in record.dispatched.values():
                for job_id in job_ids:
                    job = state.jobs.get(job_id)
                    for placement in () if job is None else job.placements:
                        for slot in placement.slots:
                            holders[(placement.node_id, slot)] = job_id
        names = self.gateway.rm.jobs
        nodes = []
        for node_id, node in sorted(state.nodes.items()):
            slots = []
            for index, offer in enumerate(node.slots):
                holder = holders.get((node_id, index))
                view = None if holder is None else names.get(holder)
                slots.append(
                    {
                        "index": index,
                        "unit": offer.unit,
                        "gpus": list(offer.gpus),
                        "jobId": holder,
                        "jobName": None if view is None else view.job_name,
                    }
                )
            nodes.append(
                {
                    "nodeId": node_id,
                    "pool": node.pool,
                    "online": node.online,
                    "draining": node.draining,
                    "lastHeartbeat": node.last_heartbeat,
                    "slots": slots,
                }
            )
        return _json({"nodes": nodes, "now": self.gateway.clock()})

    # ----- writes (authentication off only) ------------------------------------------------------

    def _writable(self) -> None:
        if self.read_only:
            raise AccessDenied("The console is read-only when authentication is on")

    async def _priority(self, request: web.Request) -> web.Response:
        self._writable()
        body = await _body(request)
        job_id = unquote(request.match_info["job"])
        params = Params({"jobId": job_id, "schedulingPriority": body.get("priority")})
        return _json(await self.gateway.call("UpdateServiceJob", params))

    async def _terminate(self, request: web.Request) -> web.Response:
        self._writable()
        body = await _body(request)
        job_id = unquote(request.match_info["job"])
        reason = str(body.get("reason") or "Terminated from the gpuquota console")
        return _json(
            await self.gateway.call("TerminateServiceJob", Params({"jobId": job_id, "reason": reason}))
        )


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError:
        raise ClientException("The request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ClientException("The request body must be a JSON object")
    return body


def _file(path: Path) -> web.Response:
    return web.Response(
        body=path.read_bytes(),
        headers={"Content-Type": CONTENT_TYPES[path.suffix] + "; charset=utf-8", "Cache-Control": "no-cache"},
    )


PLAN_LOOKAHEAD_MS = 86_400_000


def _json(data: dict[str, Any]) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), content_type="application/json")
