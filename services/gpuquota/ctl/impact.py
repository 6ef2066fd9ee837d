"""``gpuquota apply -f FILE --dry-run``: what would change, and what that would do to the jobs.

The applier (``gpuquota.ctl.apply``) compares the file with the live configuration and, in a dry run,
keeps the writes it would send. The gateway answers what they would do
(``POST /gpuquota/v1/impact``, ``gpuquota.gateway.dry_run``, computed by ``gpuquota.sim.impact`` on
a copy of the scheduler's state): the running jobs stopped at once, the running jobs that start
borrowing (and so become reclaimable), the queued jobs whose likely start moves, and each share's
limit, usage, borrowed, lent and reserved instances before and after. Nothing is applied.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError
from gpuquota.ctl.apply import Applier
from gpuquota.ctl.apply_doc import ApplyDoc
from gpuquota.ctl.render import Style

SHARE_FIGURES = ("limits", "usage", "borrowed", "lent", "reserved")


def dry_run_command(api: Api, doc: ApplyDoc, args: argparse.Namespace, style: Style) -> int:
    from gpuquota.ctl.apply import format_changes

    applier = Applier(api, dry_run=True)
    changes = applier.run(doc)
    if args.output == "json":
        render.dump_json({"changes": [c.as_dict() for c in changes], "impact": _impact(api, applier)})
        return 0
    print(format_changes(changes, style), flush=True)  # shown even if the impact fails
    found = _impact(api, applier)
    print()
    print(format_impact(found, style))
    return 0


def _impact(api: Api, applier: Applier) -> dict[str, Any]:
    try:
        return api.impact(applier.planned)
    except CliError as exc:
        raise CliError(f"the change's impact: {exc}") from None


def format_impact(impact: dict[str, Any], style: Style) -> str:
    at = impact["at"]
    blocks = [
        style(f"Impact, from the live state at {render.when(at)} (nothing applied)", "bold"),
        _rejected(impact["rejected"]),
        _section(
            "Stopped at once",
            ["JOB", "NAME", "SHARE", "KIND", "LIKELY RESTART", "REASON"],
            [
                [
                    r["job"],
                    r["jobName"],
                    _share(r),
                    render.kind_label(r["kind"]),
                    _start(r.get("restartAt"), at),
                    render.shorten(r["reason"], 60),
                ]
                for r in impact["preempted_now"]
            ],
            style,
        ),
        _section(
            "Start borrowing (reclaimable)",
            ["JOB", "NAME", "SHARE", "INSTANCES"],
            [
                [r["job"], r["jobName"], _share(r), f"{r['instances']} {r['unit']}"]
                for r in impact["becomes_borrowing"]
            ],
            style,
        ),
        _section(
            "Likely starts that move",
            ["JOB", "NAME", "SHARE", "BEFORE", "AFTER", "MOVED"],
            [
                [
                    r["job"],
                    r["jobName"],
                    _share(r),
                    _start(r["before"], at),
                    _start(r["after"], at),
                    _moved(r),
                ]
                for r in impact["start_changes"]
            ],
            style,
        ),
        style("Shares (before -> after)", "bold") + "\n" + _shares(impact["shares"]),
    ]
    if not impact.get("complete", True):
        blocks.append("(the forward run ran out of time: later starts are not shown)")
    return "\n\n".join(b for b in blocks if b)


def _section(title: str, headers: list[str], rows: list[list[str]], style: Style) -> str:
    heading = style(title, "bold")
    if not rows:
        return f"{heading}: none"
    return heading + "\n" + render.table(headers, rows, indent="  ")


def _rejected(rejected: list[dict[str, str]]) -> str:
    return "\n".join(f"the scheduler would reject {r['input']}: {r['reason']}" for r in rejected)


def _share(row: dict[str, Any]) -> str:
    return f"{row['jobQueue']}/{row['quotaShareName']}"


def _start(ms: int | None, at: int) -> str:
    if ms is None:
        return "not foreseen"
    return f"{render.when(ms)} (in {max(0, ms - at) / 1000:.0f} s)"


def _moved(row: dict[str, Any]) -> str:
    """``0.4 s later``, ``12 min later``, ``1.5 h earlier``; ``-`` when one side has no start."""
    moved = row["movedSeconds"]
    if moved is None:
        return "-"
    size = abs(moved)
    if size < 120:
        amount = f"{size:.1f} s" if size < 10 else f"{size:.0f} s"
    else:
        amount = f"{size / 60:.0f} min" if size < 7200 else f"{size / 3600:.1f} h"
    return f"{amount} {'later' if moved >= 0 else 'earlier'}"


def _shares(shares: list[dict[str, Any]]) -> str:
    rows = []
    for share in shares:
        before, after = share["before"] or {}, share["after"] or {}
        units = sorted(set(before.get("limits", {})) | set(after.get("limits", {})))
        strategy = _pair(before.get("strategy"), after.get("strategy"))
        for unit in units:
            figures = [_pair(before.get(k, {}).get(unit), after.get(k, {}).get(unit)) for k in SHARE_FIGURES]
            rows.append([f"{share['jobQueue']}/{share['quotaShareName']}", strategy, unit, *figures])
    headers = ["SHARE", "STRATEGY", "UNIT", "LIMIT", "USAGE", "BORROWED", "LENT", "RESERVED"]
    return render.table(headers, rows, indent="  ")


def _pair(before: Any, after: Any) -> str:
    shown = ["-" if v is None else str(v) for v in (before, after)]
    return shown[0] if shown[0] == shown[1] else f"{shown[0]} -> {shown[1]}"
