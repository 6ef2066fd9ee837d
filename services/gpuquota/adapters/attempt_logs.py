"""Attempt logs on a node's disk: where an attempt's log is, and how to read a piece of it.

Shared by the node agent (which writes them and serves them in distributed mode) and the gateway (which
opens them itself in embedded mode), so neither imports the other.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_CHUNK = 256 * 1024
"""The most bytes one read returns."""


def safe_name(name: str) -> str:
    """A file-name-safe form of an id."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def log_path(work_dir: Path, attempt_id: str) -> Path:
    return Path(work_dir) / "logs" / f"{safe_name(attempt_id)}.log"


def read_log(path: Path, offset: int, limit: int = MAX_CHUNK) -> bytes | None:
    """At most ``limit`` bytes of ``path`` from ``offset``; ``None`` when the file does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, offset))
            return f.read(max(0, min(limit, MAX_CHUNK)))
    except FileNotFoundError:
        return None
