"""``python -m gpuquota.observe.healthcheck``: the container image's ``HEALTHCHECK``.

Exit 0 when ``/health/live`` answers 200 on ``GPUQUOTA_METRICS_PORT`` (the scheduler and node agents
serve it there) or else on ``GPUQUOTA_PORT`` (the gateway; default 8080); exit 1 with one line otherwise.
Liveness, not readiness: a service waiting for Kafka is alive, and restarting it would not help.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping


def url(environ: Mapping[str, str]) -> str:
    port = environ.get("GPUQUOTA_METRICS_PORT") or environ.get("GPUQUOTA_PORT") or "8080"
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
