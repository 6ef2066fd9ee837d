"""``gpuquota simulate`` and ``gpuquota trace generate|export`` (interface I8): local commands that
need no gateway (they read files and recorded logs)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import TextIO

from gpuquota.adapters.event_store import EventStoreError
from gpuquota.ctl.api import CliError
from gpuquota.sim.trace import TraceError, write_trace

Command = Callable[[argparse.Namespace], int]


def guarded(command: Command, name: str) -> Command:
    """A ``CliError``, a bad trace or a missing file becomes one line on stderr and exit code 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (CliError, TraceError, EventStoreError, OSError, ValueError) as exc:
            print(f"gpuquota {name}: {exc}", file=sys.stderr)
            return 1

    return run


# ----- simulate ------------------------------------------------------------------------------------


def configure_simulate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--file",
        dest="files",
        action="append",
        required=True,
        metavar="FILE.yaml",
        help="a configuration in the apply -f format (repeat to compare several side by side)",
    )
    parser.add_argument("--trace", required=True, help="the workload: a JSON Lines trace ('-': stdin)")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--plot", metavar="FILE", help="draw usage over time and wait times (.png or .svg)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--victim-order",
        metavar="ORDER[,ORDER]",
        help="run each configuration under these victim orders (S12): aws (AWS's), leastLostWork",
    )


def victim_orders(value: str | None) -> list[str]:
    """The orders of ``--victim-order`` (none: each configuration as its file says)."""
    from gpuquota.core.checkpoints import VICTIM_ORDERS

    orders = [] if not value else [o.strip() for o in value.split(",") if o.strip()]
    for order in orders:
        if order not in VICTIM_ORDERS:
            raise CliError(f"--victim-order: {order!r} is not one of {', '.join(VICTIM_ORDERS)}")
    return orders


def simulate_command(args: argparse.Namespace) -> int:
    from gpuquota.sim import plot, report
    from gpuquota.sim.config import load_configuration
    from gpuquota.sim.engine import simulate, stderr_progress
    from gpuquota.sim.prefetch import trace_reader

    if args.plot:
        plot.check_target(args.plot)
    if args.trace == "-" and len(args.files) > 1:
        raise CliError("--trace -: standard input can be replayed only once (give a file to compare)")
    configs = [load_configuration(path) for path in args.files]
    if orders := victim_orders(args.victim_order):
        configs = [config.with_victim_order(order) for config in configs for order in orders]
    if args.trace == "-" and len(configs) > 1:
        raise CliError("--trace -: standard input can be replayed only once (give a file to compare)")
    results = []
    for config in configs:
        progress = None if args.quiet else stderr_progress(config.name)
        results.append(simulate(config, trace_reader(args.trace), progress=progress))
    if args.output == "json":
        print(json.dumps(report.as_json(results), indent=2))
    else:
        print(report.table(results))
    if args.plot:
        plot.draw(results, args.plot)
        if not args.quiet:
            print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


# ----- trace ---------------------------------------------------------------------------------------


def configure_trace(parser: argparse.ArgumentParser) -> None:
    from gpuquota.sim.generate import Workload

    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    gen = sub.add_parser(
        "generate", help="write a synthetic trace (seeded)", description="write a synthetic trace"
    )
    defaults = Workload()
    helps = {
        "shares": "quota shares and their weights, NAME[:WEIGHT],...",
        "unit": "capacity unit of every job",
        "jobs": "number of jobs",
        "rate_per_hour": "mean submissions per hour",
        "cycle": "daily swing of the rate (0: flat; 0.6: 40%% to 160%% of the mean, peak at 15:00)",
        "median_duration": "median job duration, seconds (log-normal)",
        "sigma": "spread of the log-normal durations (heavier tail when larger)",
        "max_duration": "longest duration, seconds",
        "priorities": "priorities and their weights, N[:WEIGHT],...",
        "gang_sizes": "instances per job and their weights, N[:WEIGHT],...",
        "checkpoint_every": "seconds between checkpoints (preempted jobs resume from the last one)",
        "preemption_retries": "preemptions a job survives before it fails",
        "failure_rate": "fraction of jobs that exit with code 1",
        "seed": "random seed",
    }
    for spec in fields(Workload):
        default = getattr(defaults, spec.name)
        kind = type(default) if default is not None else (float if spec.name == "checkpoint_every" else int)
        flag = "--" + spec.name.replace("_", "-")
        gen.add_argument(flag, type=kind, default=default, help=f"{helps[spec.name]} (default: {default})")
    gen.add_argument("-o", "--output", default="-", help="file to write ('-': stdout)")
    export = sub.add_parser(
        "export", help="write the trace of a recorded log", description="write the trace of a recorded log"
    )
    source = export.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", help="data directory of `gpuquota up` (SQLite log)")
    source.add_argument("--database-url", help="PostgreSQL log of the distributed mode")
    export.add_argument("--queue", help="only this job queue's jobs")
    export.add_argument("--pool", default="default", help="the log's pool (default: default)")
    export.add_argument("-o", "--output", default="-", help="file to write ('-': stdout)")


def trace_command(args: argparse.Namespace) -> int:
    if args.trace_command == "generate":
        return _generate(args)
    return _export(args)


def _open_output(path: str) -> TextIO:
    return sys.stdout if path == "-" else open(path, "w", encoding="utf-8")


def _generate(args: argparse.Namespace) -> int:
    from gpuquota.sim.generate import Workload, generate

    workload = Workload(**{spec.name: getattr(args, spec.name) for spec in fields(Workload)})
    if workload.jobs < 0 or workload.rate_per_hour <= 0 or not 0 <= workload.cycle <= 1:
        raise CliError("--jobs must be >= 0, --rate-per-hour > 0 and --cycle within 0..1")
    out = _open_output(args.output)
    try:
        write_trace(generate(workload), out)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _export(args: argparse.Namespace) -> int:
    from gpuquota.sim.export import Exported, export_store, open_log

    async def read() -> Exported:
        store = await open_log(args.data_dir, args.database_url)
        try:
            return await export_store(store, args.pool, args.queue)
        finally:
            await store.close()

    exported = asyncio.run(read())
    out = _open_output(args.output)
    try:
        write_trace(exported.jobs, out)
    finally:
        if out is not sys.stdout:
            out.close()
    skipped = exported.never_ran
    if skipped:
        print(f"gpuquota trace export: left out {skipped} job(s) that never ran", file=sys.stderr)
    return 0
