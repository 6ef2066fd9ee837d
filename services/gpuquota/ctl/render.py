"""Terminal output: aligned tables, and a few colours when stdout is a TTY (and ``NO_COLOR`` is unset)."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

STATUS_COLOURS = {
    "SUBMITTED": "dim",
    "RUNNABLE": "yellow",
    "SCHEDULED": "cyan",
    "STARTING": "cyan",
    "RUNNING": "green",
    "SUCCEEDED": "blue",
    "FAILED": "red",
}


class Style:
    """Wraps text in ANSI colours only when ``enabled``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO | None = None) -> Style:
        stream = stream or sys.stdout
        tty = hasattr(stream, "isatty") and stream.isatty()
        return cls(bool(tty) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb")

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"

    def status(self, status: str) -> str:
        return self(status, STATUS_COLOURS[status]) if status in STATUS_COLOURS else status

    def verdict(self, ok: bool) -> str:
        return self("PASS", "bold", "green") if ok else self("FAIL", "bold", "red")


def visible_len(text: str) -> int:
    return cell_len(_ANSI.sub("", text))


_UNWRAPPED = 10_000
"""The console width tables are laid out in: wider than any row, so no cell wraps."""


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, indent: str = "") -> str:
    """Rows aligned under ``headers``, two spaces between columns (cells may carry ``Style``'s ANSI
    colours); no trailing spaces. rich lays it out by display width and writes colours only where a
    cell carries them."""
    grid = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="", show_edge=False)
    for header in headers:
        grid.add_column(Text(header), no_wrap=True)
    for row in rows:
        grid.add_row(*(Text.from_ansi(cell) for cell in row))
    out = io.StringIO()
    console = Console(
        file=out, width=_UNWRAPPED, force_terminal=True, color_system="standard", no_color=False
    )
    console.print(grid)
    return "\n".join((indent + line).rstrip() for line in out.getvalue().splitlines())


def units(counts: dict[str, int] | None, single: str | None = None) -> str:
    """``{"ml.g5.xlarge": 2}``: ``2`` when ``single`` is that unit, else ``ml.g5.xlarge=2``."""
    if not counts:
        return "0" if single is not None else "-"
    if single is not None and set(counts) <= {single}:
        return str(counts.get(single, 0))
    return ",".join(f"{u}={n}" for u, n in sorted(counts.items()))


def single_unit(rows: Iterable[dict[str, Any]]) -> str | None:
    """The only capacity unit the shares use, if there is exactly one."""
    found = {u for row in rows for u in row.get("limits", {})}
    return found.pop() if len(found) == 1 else None


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def dump_json(data: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str), file=stream or sys.stdout)


def answered(output: str, key: str, rows: list[dict[str, Any]], empty: str) -> bool:
    """Print a list command's answer when it needs no table: JSON (``-o json``), or ``empty`` when
    there are no rows. ``False``: the caller prints its table."""
    if output == "json":
        dump_json({key: rows})
        return True
    if not rows:
        print(empty)
        return True
    return False


def shorten(text: str | None, width: int = 72) -> str:
    if not text:
        return "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def lost_work(lost: dict[str, Any] | None) -> str:
    """S12's ``gpuquotaLostWork`` of a preempted attempt: ``"95 s x 2 GPUs = 190 GPU-s"``, or ``-``."""
    if not lost:
        return "-"
    return f"{lost['seconds']:.0f} s x {lost['gpus']} GPUs = {lost['gpuSeconds']:.0f} GPU-s"


def attempts_table(attempts: list[dict[str, Any]]) -> str:
    """A DescribeServiceJob's attempts, one row each (with S12's lost work of a preempted one)."""
    rows = [
        [
            str(i),
            when(a.get("startedAt")),
            when(a.get("stoppedAt")),
            shorten(a.get("statusReason"), 70),
            lost_work(a.get("gpuquotaLostWork")),
        ]
        for i, a in enumerate(attempts, start=1)
    ]
    return table(["#", "STARTED", "STOPPED", "REASON", "LOST WORK"], rows)


def kind_label(kind: str) -> str:
    labels = {"CROSS_SHARE": "cross-share", "IN_SHARE": "in-share", "TRAINING_PLAN": "training-plan"}
    return labels.get(kind, kind.lower())
