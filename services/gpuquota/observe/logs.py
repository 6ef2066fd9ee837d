"""Logging of the services (I7): timestamps and levels always; ``GPUQUOTA_LOG_FORMAT=json`` for one JSON
object per line.

The ids a line is about (``job_id``, ``attempt_id``, ``share``, ``node_id``) are fields of their own in
JSON (and ``key=value`` pairs after the message in text). They come from ``extra={...}`` of the call,
or from :func:`bind`, which sets them for the current asyncio task and the tasks it creates (the node
agent binds the job and attempt in each attempt's task, so every line of that task carries them).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
from typing import Literal

LogFormat = Literal["text", "json"]
ID_FIELDS = ("job_id", "attempt_id", "share", "node_id")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(ids)s"

_bound: contextvars.ContextVar[dict[str, str] | None]
_bound = contextvars.ContextVar("gpuquota_log_ids", default=None)


def bind(**ids: str | None) -> None:
    """Attach ``ids`` (``job_id``, ``attempt_id``, ``share``, ``node_id``) to the lines of this context."""
    unknown = set(ids) - set(ID_FIELDS)
    if unknown:
        raise ValueError(f"not a log id field: {sorted(unknown)}")
    _bound.set({**(_bound.get() or {}), **{k: v for k, v in ids.items() if v is not None}})


class _Ids(logging.Filter):
    """Copies the bound ids onto each record (an ``extra=`` of the call wins) and renders ``ids``."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_bound.get() or {}).items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        pairs = [
            f"{key}={getattr(record, key)}" for key in ID_FIELDS if getattr(record, key, None) is not None
        ]
        record.ids = (" [" + " ".join(pairs) + "]") if pairs else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the ids."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ID_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Log to stderr at ``level`` in ``fmt`` (``text`` or ``json``); replaces any earlier handler."""
    if fmt not in ("text", "json"):
        raise ValueError(f"GPUQUOTA_LOG_FORMAT must be text or json, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Ids())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
