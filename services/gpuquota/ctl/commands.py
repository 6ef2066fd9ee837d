"""``gpuquota apply``, ``gpuquota jobs ...``, ``gpuquota shares`` and ``gpuquota explain`` (interface I5).

Each command talks to a running gateway (``--endpoint``, default ``$GPUQUOTA_ENDPOINT`` or
http://127.0.0.1:8642): the AWS Batch API through boto3, plus gpuquota's own read endpoints for
what AWS has no call for (``/gpuquota/v1/shares``, ``/gpuquota/v1/jobs/{id}/explain``). Tables by
default, ``--output json`` for scripts. Failures print one line to stderr and exit 1; usage errors
(argparse) exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError, default_endpoint
from gpuquota.ctl.options import add_common
from gpuquota.ctl.render import Style
from gpuquota.ctl.submit import configure_logs, configure_submit, logs_command, submit_command
from gpuquota.ctl.watch import add_watch
from gpuquota.wire.base import UNLIMITED_BORROW

JOB_STATUSES = ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
DEFAULT_TERMINATE_REASON = "Terminated by gpuquota jobs terminate"


def run(command: Callable[[Api, argparse.Namespace, Style], int], args: argparse.Namespace) -> int:
    """Run ``command`` with an ``Api``; how it fails: ``guarded``."""
    api: Api | None = None

    def body() -> int:
        nonlocal api
        api = Api(args.endpoint or default_endpoint())
        style = Style.for_stream(sys.stdout)
        if getattr(args, "watch", False):
            from gpuquota.ctl.watch import loop

            client = api
            return loop(lambda: command(client, args, style), args)
        return command(api, args, style)

    sub = (getattr(args, f"{c}_command", None) for c in ("jobs", "shares", "queues"))
    try:
        return guarded("gpuquota " + " ".join(filter(None, (args.command, *sub))), body)
    finally:
        if api is not None:
            api.close()


def guarded(prog: str, body: Callable[[], int]) -> int:
    """Runs ``body``, a command; a ``CliError`` becomes one line on stderr and exit code 1, an interrupt
    exit code 130, a broken pipe (``| head``) exit code 1 with nothing more on stdout."""
    try:
        return body()
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        quiet_stdout()
        return 1


def quiet_stdout() -> None:
    """After a broken pipe (``gpuquota jobs list | head``): send what is left of stdout nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# ----- apply ---------------------------------------------------------------------------------------


def configure_apply(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, help="the YAML file to apply")
    parser.add_argument("--dry-run", action="store_true", help="show what would change and its impact")
    add_common(parser)


def apply_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    from gpuquota.ctl.apply import apply, format_changes
    from gpuquota.ctl.apply_doc import load
    from gpuquota.ctl.impact import dry_run_command

    doc = load(args.file)
    if args.dry_run:  # the changes and what they would do to the jobs: gpuquota.ctl.impact
        return dry_run_command(api, doc, args, style)
    changes = apply(api, doc)
    if args.output == "json":
        render.dump_json({"changes": [c.as_dict() for c in changes]})
        return 0
    print(format_changes(changes, style))
    return 0


# ----- jobs ----------------------------------------------------------------------------------------


def configure_jobs(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="jobs_command", metavar="SUBCOMMAND", required=True)
    listing = sub.add_parser("list", help="list jobs (all statuses unless --status)")
    listing.add_argument("--queue", help="only this job queue")
    listing.add_argument("--share", help="only this quota share")
    listing.add_argument("--status", choices=JOB_STATUSES, type=str.upper, help="only this status")
    describe = sub.add_parser("describe", help="show one job")
    describe.add_argument("job", metavar="JOB", help="job id or ARN")
    update = sub.add_parser("update-priority", help="change a job's scheduling priority (0-9999)")
    update.add_argument("job", metavar="JOB", help="job id or ARN")
    update.add_argument("priority", metavar="PRIORITY", type=int)
    terminate = sub.add_parser("terminate", help="terminate a job")
    terminate.add_argument("job", metavar="JOB", help="job id or ARN")
    terminate.add_argument("--reason", default=DEFAULT_TERMINATE_REASON, help="the job's statusReason")
    submit = sub.add_parser("submit", help="submit a job: a payload file (-f) or a command (-- CMD ...)")
    configure_submit(submit)
    logs = sub.add_parser("logs", help="print an attempt's log (the latest unless --attempt)")
    configure_logs(logs)
    add_watch(listing)
    for p in (listing, describe, update, terminate, submit, logs):
        add_common(p)


def jobs_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    handlers: dict[str, Callable[[Api, argparse.Namespace, Style], int]] = {
        "list": _jobs_list,
        "describe": _jobs_describe,
        "update-priority": _jobs_update_priority,
        "terminate": _jobs_terminate,
        "submit": submit_command,
        "logs": logs_command,
    }
    return handlers[args.jobs_command](api, args, style)


def list_jobs(
    api: Api, queue: str | None = None, share: str | None = None, status: str | None = None
) -> list[dict[str, Any]]:
    """Jobs of every status (or ``status``), optionally of one queue and one quota share, newest first."""
    params: dict[str, Any] = {}
    if queue:
        params["jobQueue"] = queue
    if share:
        known = [row for row in api.shares(queue) if row["quotaShareName"] == share]
        if not known:
            where = f" in job queue {queue}" if queue else ""
            raise CliError(f"Quota share {share} does not exist{where}")
        params["filters"] = [{"name": "QUOTA_SHARE_NAME", "values": [share]}]
        if status:
            params["jobStatus"] = status
    elif status:
        params["jobStatus"] = status
    else:  # no status filter: every job created after the epoch, whatever its status
        params["filters"] = [{"name": "AFTER_CREATED_AT", "values": ["0"]}]
    return api.pages("list_service_jobs", "jobSummaryList", **params)


def _jobs_list(api: Api, args: argparse.Namespace, style: Style) -> int:
    jobs = list_jobs(api, args.queue, args.share, args.status)
    if render.answered(args.output, "jobs", jobs, "No jobs."):
        return 0
    rows = [
        [
            job["jobId"],
            job["jobName"],
            job.get("quotaShareName", "-"),
            style.status(job["status"]),
            render.when(job.get("createdAt")),
            render.shorten(job.get("statusReason"), 60),
        ]
        for job in jobs
    ]
    print(render.table(["JOB ID", "NAME", "SHARE", "STATUS", "CREATED", "REASON"], rows))
    return 0


def _jobs_describe(api: Api, args: argparse.Namespace, style: Style) -> int:
    job = api.call("describe_service_job", jobId=args.job)
    if args.output == "json":
        render.dump_json(job)
        return 0
    print(format_job(job, style))
    return 0


def format_job(job: dict[str, Any], style: Style) -> str:
    queue = str(job.get("jobQueue", "-")).rsplit("/", 1)[-1]
    usage = ", ".join(f"{u['quantity']:g} x {u['capacityUnit']}" for u in job.get("capacityUsage", []))
    preempted = job.get("preemptionSummary", {}).get("preemptedAttemptCount", 0)
    fields = [
        ("Job", f"{job['jobName']} ({job['jobId']})"),
        ("Status", style.status(job["status"]) + (" (terminated)" if job.get("isTerminated") else "")),
        ("Reason", job.get("statusReason") or "-"),
        ("Queue / share", f"{queue} / {job.get('quotaShareName', '-')}"),
        ("Priority", str(job.get("schedulingPriority", 0))),
        ("Demand", usage or "-"),
        ("Created", render.when(job.get("createdAt"))),
        ("Scheduled", render.when(job.get("scheduledAt"))),
        ("Started", render.when(job.get("startedAt"))),
        ("Stopped", render.when(job.get("stoppedAt"))),
        ("Preempted", f"{preempted} time(s)"),
    ]
    width = max(len(k) for k, _ in fields)
    lines = [f"{style(k.ljust(width), 'bold')}  {v}" for k, v in fields]
    attempts = job.get("attempts", [])
    if attempts:
        lines += ["", style("Attempts", "bold"), render.attempts_table(attempts)]
        title = f"Model and output of attempt {len(attempts)}"
        lines += format_outputs(attempts[-1].get("gpuquotaOutputs", []), style, title)
    return "\n".join(lines)


def format_outputs(outputs: list[dict[str, str]], style: Style, title: str) -> list[str]:
    """Where the attempt's instances kept /opt/ml/model and /opt/ml/output, on which node."""
    if not outputs:
        return []
    rows = [[o["host"], o["nodeId"], o["modelDir"], o["outputDir"]] for o in outputs]
    return ["", style(title, "bold"), render.table(["HOST", "NODE", "MODEL", "OUTPUT"], rows)]


def _jobs_update_priority(api: Api, args: argparse.Namespace, style: Style) -> int:
    before = api.call("describe_service_job", jobId=args.job)
    out = api.call("update_service_job", jobId=args.job, schedulingPriority=args.priority)
    if args.output == "json":
        render.dump_json(
            {**out, "previousPriority": before.get("schedulingPriority"), "priority": args.priority}
        )
        return 0
    print(
        f"{out['jobName']} ({out['jobId']}): priority {before.get('schedulingPriority')} -> {args.priority}"
    )
    return 0


def _jobs_terminate(api: Api, args: argparse.Namespace, style: Style) -> int:
    job = api.call("describe_service_job", jobId=args.job)
    api.call("terminate_service_job", jobId=args.job, reason=args.reason)
    if args.output == "json":
        render.dump_json({"jobId": job["jobId"], "jobName": job["jobName"], "reason": args.reason})
        return 0
    if job["status"] in ("SUCCEEDED", "FAILED"):
        print(f"{job['jobName']} ({job['jobId']}) is already {job['status']}: nothing to terminate")
    else:
        print(f"{job['jobName']} ({job['jobId']}): termination requested ({args.reason})")
    return 0


# ----- shares --------------------------------------------------------------------------------------


def configure_shares(parser: argparse.ArgumentParser) -> None:
    from gpuquota.ctl.manage import add_share_actions

    sub = parser.add_subparsers(dest="shares_command", metavar="SUBCOMMAND")
    listing = sub.add_parser("list", help="show the quota shares (the default)")
    for p in (parser, listing):
        p.add_argument("--queue", default=argparse.SUPPRESS, help="only this job queue")
        add_watch(p)
    for p in (parser, listing, *add_share_actions(sub)):
        add_common(p)


def shares_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    if getattr(args, "shares_command", None) not in (None, "list"):
        from gpuquota.ctl.manage import share_action

        return share_action(api, args, style)
    rows = api.shares(getattr(args, "queue", None))
    if render.answered(args.output, "quotaShares", rows, "No quota shares."):
        return 0
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_queue.setdefault(row["jobQueue"], []).append(row)
    blocks = []
    for queue, queue_rows in by_queue.items():
        unit = render.single_unit(queue_rows)
        title = style(f"Job queue {queue}", "bold") + (f"  (instances of {unit})" if unit else "")
        blocks.append(title + "\n" + format_shares(queue_rows, style) + above_maximum(queue_rows, style))
    print("\n\n".join(blocks))
    return 0


def _above(row: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """unit -> (usage, maximum) where the share holds more than its maximum M(s,u): its limit was
    lowered (or its strategy changed) under running jobs, which finish; nothing new starts there."""
    maxima = row.get("maximum") or {}
    usage = row.get("usage") or {}
    return {
        u: (n, maxima[u])
        for u, n in sorted(usage.items())
        if maxima.get(u, 0) is not None and n > maxima.get(u, 0)
    }


def above_maximum(rows: list[dict[str, Any]], style: Style) -> str:
    """The footnote of the shares marked ``*`` in USED."""
    lines = []
    for row in rows:
        for unit, (used, most) in _above(row).items():
            lines.append(
                f"  * {row['quotaShareName']} above its maximum: {used}/{most} {unit} "
                "(limit lowered; running jobs finish, no new ones start)"
            )
    return "".join("\n" + style(line, "red") for line in lines)


def _preemption_cell(row: dict[str, Any]) -> str:
    """In-share preemption and S10's opt-in hygiene (minimum runtime, reborrow backoff), or ``-``."""
    hygiene = row.get("hygiene") or {}
    parts = ["in-share"] if row.get("inSharePreemption") == "ENABLED" else []
    if (seconds := hygiene.get("gpuquota:minRuntimeSeconds")) is not None:
        parts.append(f"min runtime {seconds}s")
    if (seconds := hygiene.get("gpuquota:reborrowBackoffSeconds")) is not None:
        parts.append(f"reborrow backoff {seconds}s")
    return ", ".join(parts) or "-"


def format_shares(rows: list[dict[str, Any]], style: Style, *, jobs: dict[str, str] | None = None) -> str:
    """The per-share table of one queue; ``jobs`` (share -> rendered jobs) adds a JOBS column (demo)."""
    unit = render.single_unit(rows)
    headers = ["SHARE", "STRATEGY", "LIMIT", "USED", "BORROWED", "LENT", "QUEUED"]
    headers += ["PREEMPTION", "STATE"] if jobs is None else ["JOBS"]
    out = []
    for row in rows:
        strategy = row["strategy"]
        if (borrow := row.get("borrowLimit")) is not None:
            strategy += " unlimited" if borrow == UNLIMITED_BORROW else f" {borrow}%"
        borrowed = render.units(row.get("borrowed"), unit)
        lent = render.units(row.get("lent"), unit)
        cells = [
            style(row["quotaShareName"], "bold"),
            strategy,
            render.units(row["limits"], unit),
            render.units(row.get("usage"), unit) + (style("*", "red") if _above(row) else ""),
            style(borrowed, "yellow") if borrowed not in ("0", "-") else borrowed,
            style(lent, "cyan") if lent not in ("0", "-") else lent,
            str(row.get("runnable", 0)),
        ]
        if jobs is None:
            state = (
                row["state"] if row.get("status", "VALID") == "VALID" else f"{row['state']} ({row['status']})"
            )
            cells += [_preemption_cell(row), state]
        else:
            cells.append(jobs.get(row["quotaShareName"], "-"))
        out.append(cells)
    return render.table(headers, out, indent="  ")


# ----- explain -------------------------------------------------------------------------------------


def configure_explain(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id or ARN")
    add_common(parser)


def explain_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    data = api.explain(args.job)
    if args.output == "json":
        render.dump_json(data)
        return 0
    print(format_explain(data, style))
    return 0


FIGURE_LABELS = (
    ("demand", "demand"),
    ("poolCapacity", "pool capacity C(u)"),
    ("poolUsage", "pool usage (all shares)"),
    ("reservedIdle", "reserved idle R(u)"),
    ("held", "held for preemptors"),
    ("shareUsage", "share usage U(s,u)"),
    ("shareLimit", "share limit L(s,u)"),
    ("shareMax", "share maximum M(s,u)"),
    ("freeSlots", "free slots on nodes"),
)

PREEMPTION_LABELS = (
    ("preemptorDemand", "preemptor demand"),
    ("poolCapacity", "pool capacity C(u)"),
    ("poolUsage", "pool usage"),
    ("reservedIdle", "reserved idle R(u)"),
    ("held", "held for preemptors"),
    ("preemptorShareUsage", "preemptor share usage"),
    ("preemptorShareLimit", "preemptor share limit"),
    ("victimShareUsage", "this share's usage"),
    ("victimShareLimit", "this share's limit"),
)


def _figures(values: dict[str, Any], labels: tuple[tuple[str, str], ...], indent: str = "  ") -> list[str]:
    rows = [(label, values[key]) for key, label in labels if key in values]
    width = max((len(label) for label, _ in rows), default=0)
    return [f"{indent}{label.ljust(width)}  {'unbounded' if v is None else v}" for label, v in rows]


def _start_estimate(estimate: dict[str, Any] | None, style: Style) -> list[str]:
    """When the job is expected to start (``gpuquota.sim.estimate``), and on what assumptions."""
    if estimate is None:
        return []

    def at(ms: int | None, unknown: str, not_before: int | None) -> str:
        if ms is None:
            return unknown if not_before is None else f"after {render.when(not_before)} (estimate cut short)"
        wait = max(0, ms - estimate["estimatedAt"]) / 1000
        return f"{render.when(ms)} (in {wait:.0f} s)"

    return [
        "",
        style("Start estimate", "bold"),
        f"  likely     {at(estimate['likelyStartAt'], 'not foreseen', estimate.get('likelyNotBefore'))}",
        f"  latest     {at(estimate['latestStartAt'], 'no bound', estimate.get('latestNotBefore'))}",
        *(f"  assuming {line}" for line in estimate.get("assumptions", [])),
    ]


def format_explain(data: dict[str, Any], style: Style) -> str:
    demand = data.get("demand", {})
    lines = [
        f"{style(data['jobName'], 'bold')} ({data['jobId']})",
        f"  share {data['jobQueue']}/{data['quotaShareName']}, priority {data['schedulingPriority']}, "
        f"needs {demand.get('quantity', '?')} x {demand.get('capacityUnit', '?')}",
        f"  status {style.status(data['status'])}"
        + (f": {data['statusReason']}" if data.get("statusReason") else ""),
    ]
    explanation = data.get("explanation")
    if explanation is not None:
        lines += ["", f"{style('Why', 'bold')}: {explanation['reason']}", f"  {explanation['message']}"]
        if explanation.get("action"):
            lines.append(f"  {style('What helps', 'bold')}: {explanation['action']}")
        if explanation.get("until"):
            lines.append(f"  until {render.when(explanation['until'])}")
        if explanation.get("position"):
            head = explanation.get("shareHeadName") or explanation.get("shareHead")
            lines.append(f"  position {explanation['position']} in its share's queue (head: {head})")
        if explanation.get("figures"):
            unit = demand.get("capacityUnit", "")
            lines += [
                "",
                style(f"Figures ({unit})", "bold"),
                *_figures(explanation["figures"], FIGURE_LABELS),
            ]
        lines += _start_estimate(explanation.get("startEstimate"), style)
    elif data["status"] in ("SUCCEEDED", "FAILED"):
        lines += ["", f"{style('Why', 'bold')}: the job has finished ({data['status']})."]
    lines += format_outputs(data.get("outputs") or [], style, "Model and output of the latest attempt")
    last = data.get("lastPreemption")
    if last is not None:
        preemptor = last.get("preemptorJobName") or last["preemptorJobId"]
        share = last["preemptorQuotaShareName"]
        by = (  # a training plan's window end has no preemptor job (S11)
            [f"  preemptor  {preemptor} ({last['preemptorJobId']}) of share {share}"]
            if last["preemptorJobId"]
            else []
        )
        lines += [
            "",
            style(f"Last preemption ({data.get('preemptedAttemptCount', 1)} in all)", "bold"),
            f"  kind       {render.kind_label(last['kind'])}",
            *by,
            f"  decided    {render.when(last.get('decidedAt'))}",
            f"  cause      {last['statusReason']}",
            f"  lost work  {render.lost_work(last.get('lostWork'))} (since its last checkpoint)",
            style(f"  figures when decided ({last['figures'].get('unit', '')})", "dim"),
            *_figures(last["figures"], PREEMPTION_LABELS, indent="    "),
        ]
    return "\n".join(lines)
