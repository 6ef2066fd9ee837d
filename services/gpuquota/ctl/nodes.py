"""``gpuquota nodes [list|drain NODE|undrain NODE]`` (interface I9).

``list`` (the default) shows each node's state (READY, DRAINING, LOST), its slots per unit as
used/total, GPUs, the attempts it runs, the age of its last recorded heartbeat and the address it
advertised (how the other nodes of an attempt reach it; ``-``: none, they use its node id).
``drain`` stops new dispatches to a node while its running attempts finish; ``undrain`` puts it back
in service.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api
from gpuquota.ctl.options import add_common
from gpuquota.ctl.render import Style

STATE_COLOURS = {"READY": "green", "DRAINING": "yellow", "LOST": "red"}


def configure_nodes(parser: argparse.ArgumentParser) -> None:
    from gpuquota.ctl.watch import add_watch

    sub = parser.add_subparsers(dest="nodes_command", metavar="SUBCOMMAND")
    listing = sub.add_parser("list", help="list nodes (the default)")
    drain = sub.add_parser("drain", help="no new attempts on NODE; its running attempts finish")
    undrain = sub.add_parser("undrain", help="put a drained NODE back in service")
    for p in (drain, undrain):
        p.add_argument("node", metavar="NODE", help="node id")
    for p in (parser, listing):
        add_watch(p)
    for p in (parser, listing, drain, undrain):
        add_common(p)


def nodes_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    action = getattr(args, "nodes_command", None) or "list"
    if action == "list":
        return _list(api, args, style)
    out = api.set_draining(args.node, action == "drain")
    if args.output == "json":
        render.dump_json(out)
    else:
        print(f"node {out['nodeId']}: {style(out['state'], STATE_COLOURS[out['state']])}")
    return 0


def _list(api: Api, args: argparse.Namespace, style: Style) -> int:
    nodes = api.nodes()
    if render.answered(args.output, "nodes", nodes, "No nodes."):
        return 0
    print(
        render.table(
            ["NODE", "POOL", "STATE", "SLOTS (USED/TOTAL)", "GPUS", "ATTEMPTS", "HEARTBEAT", "ADDRESS"],
            [_row(n, style) for n in nodes],
        )
    )
    return 0


def _row(node: dict[str, Any], style: Style) -> list[str]:
    used = node.get("usedSlots", {})
    slots = ",".join(f"{unit} {used.get(unit, 0)}/{total}" for unit, total in sorted(node["slots"].items()))
    jobs = ",".join(a["jobName"] for a in node["attempts"]) or "-"
    return [
        style(node["nodeId"], "bold"),
        node["pool"],
        style(node["state"], STATE_COLOURS.get(node["state"], "dim")),
        slots or "-",
        str(node["gpus"]),
        f"{len(node['attempts'])} {render.shorten(jobs, 40)}" if node["attempts"] else "0",
        f"{node['heartbeatAgeSeconds']:g}s ago",
        node.get("address") or "-",
    ]
