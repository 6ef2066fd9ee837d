"""``gpuquota plans [list|delete NAME]`` (S11): training plans, their windows and GPU-hours.

``list`` (the default) shows, per plan, its service environment and unit, its count, the window open
now (or the next one), its allocations, its nodes, and its used and idle GPU-hours so far (idle: the
capacity of its windows so far that no attempt used). ``delete`` removes a plan; an open window closes
at once, its jobs preempted as at its end. Plans are created and changed with ``gpuquota apply -f``
(a ``trainingPlans`` section).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api
from gpuquota.ctl.options import add_common
from gpuquota.ctl.render import Style

HEADERS = [
    "PLAN",
    "ENVIRONMENT",
    "UNIT",
    "COUNT",
    "WINDOW",
    "ALLOCATIONS",
    "NODES",
    "USED GPU-H",
    "IDLE GPU-H",
]


def configure_plans(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="plans_command", metavar="SUBCOMMAND")
    listing = sub.add_parser("list", help="list training plans (the default)")
    delete = sub.add_parser("delete", help="delete training plan NAME (an open window closes now)")
    delete.add_argument("name", metavar="NAME", help="training plan name")
    for p in (parser, listing, delete):
        add_common(p)


def plans_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    action = getattr(args, "plans_command", None) or "list"
    if action == "delete":
        out = api.delete_plan(args.name)
        if args.output == "json":
            render.dump_json(out)
        else:
            print(f"training plan {out['trainingPlanName']}: deleted")
        return 0
    plans = api.plans()
    if render.answered(args.output, "trainingPlans", plans, "No training plans."):
        return 0
    print(render.table(HEADERS, [row(plan, style, int(time.time() * 1000)) for plan in plans]))
    return 0


def row(plan: dict[str, Any], style: Style, now: int) -> list[str]:
    allocations = ",".join(f"{a['quotaShare']}={a['count']}" for a in plan["allocations"])
    return [
        style(plan["trainingPlanName"], "bold"),
        plan["serviceEnvironment"],
        plan["capacityUnit"],
        str(plan["count"]),
        window(plan, style, now),
        allocations or "-",
        ",".join(plan["nodes"]) or "-",
        f"{plan['usedGpuHours']:g}",
        f"{plan['idleGpuHours']:g}",
    ]


def window(plan: dict[str, Any], style: Style, now: int) -> str:
    """The window open now (green), else the next one, else ``-``; and how many there are."""
    count = len(plan["windows"])
    suffix = f" ({count} windows)" if count > 1 else ""
    current = plan.get("openWindow")
    if current is not None:
        return style(f"open until {render.when(current['end'])}", "green") + suffix
    upcoming = [w for w in plan["windows"] if w["start"] > now]
    if not upcoming:
        return style("ended", "dim")
    first = upcoming[0]
    return f"next {render.when(first['start'])} - {render.when(first['end'])}" + suffix
