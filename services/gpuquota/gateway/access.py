"""Who may call what: the principal of a request (``gpuquota.gateway.auth`` verifies its signature)
and the checks a share-limited key meets (its jobs, its shares).

Each ``Operation`` (``gpuquota.gateway.context``) names the ``Guard`` that checks such a key beyond
``Principal.may``: the share a job is submitted to, or the jobs it touches.
"""

from __future__ import annotations

import datetime as dt

from aiohttp import web

from gpuquota.gateway.auth import SERVICE, AccessDenied, Keyring, Principal, SignedRequest, verify
from gpuquota.gateway.context import Context
from gpuquota.gateway.errors import ClientException
from gpuquota.support.clock import Clock


async def authenticate(
    request: web.Request, keyring: Keyring | None, clock: Clock, services: tuple[str, ...] = (SERVICE,)
) -> Principal | None:
    """The principal that signed ``request`` for one of ``services`` (``None`` when authentication
    is off)."""
    if keyring is None:
        return None
    headers: dict[str, list[str]] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), []).append(value)
    raw_path, _, raw_query = request.raw_path.partition("?")
    signed = SignedRequest(request.method, raw_path, raw_query, headers, await request.read())
    now = dt.datetime.fromtimestamp(clock() / 1000, dt.UTC)
    return verify(signed, keyring, now, services)


def denied(principal: Principal, action: str) -> AccessDenied:
    return AccessDenied(f"User {principal.access_key} is not authorized to perform: {action}")


def check_job(gw: Context, principal: Principal, action: str, ref: str) -> None:
    """Deny unless ``ref`` is unknown (the operation then says so) or a job of a share of the key."""
    try:
        job = gw.job(ref)
    except ClientException:
        return
    if not principal.owns(job.job_queue, job.quota_share):
        raise denied(principal, f"{action} on {gw.arns.job(job.job_id)}")
