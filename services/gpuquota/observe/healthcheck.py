"""``python -m gpuquota.observe.healthcheck``: the container image's ``HEALTHCHECK``.

Exit 0 when ``/health/live`` answers 200 on the service's port, exit 1 with one line otherwise. The
port: ``GPUQUOTA_METRICS_PORT`` (the scheduler and node agents serve it there), else ``GPUQUOTA_PORT``
(the gateway, ``gpuquota up``), else the default port of the container's command, which is process 1
inside a container: ``gpuquota up`` listens on 8642 (or its ``--port``), ``gpuquota gateway`` on 8080.
Liveness, not readiness: a service waiting for Kafka is alive, and restarting it would not help.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

GATEWAY_PORT = "8080"
UP_PORT = "8642"


def command_line(pid: int = 1) -> list[str]:
    """The argv of process ``pid`` (empty when it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def default_port(argv: Sequence[str]) -> str:
    """The gateway's port when no variable names one: ``gpuquota up``'s ``--port`` or 8642, else 8080."""
    if "up" not in argv:
        return GATEWAY_PORT
    for index, part in enumerate(argv):
        if part == "--port" and index + 1 < len(argv):
            return argv[index + 1]
        if part.startswith("--port="):
            return part.partition("=")[2]
    return UP_PORT


def url(environ: Mapping[str, str], argv: Sequence[str] | None = None) -> str:
    port = environ.get("GPUQUOTA_METRICS_PORT") or environ.get("GPUQUOTA_PORT")
    if not port:
        port = default_port(command_line() if argv is None else argv)
    return f"http://127.0.0.1:{port}/health/live"


def main(environ: Mapping[str, str] = os.environ) -> int:
    target = url(environ)
    try:
        with urllib.request.urlopen(target, timeout=4) as response:
            if response.status == 200:
                return 0
            problem = f"HTTP {response.status}"
    except (OSError, urllib.error.URLError) as exc:
        problem = str(exc)
    print(f"healthcheck: {target}: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
