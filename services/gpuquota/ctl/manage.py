"""``gpuquota shares disable|enable|delete SHARE`` and ``gpuquota queues [list|disable|enable|delete]``
(interface I9): the CLI takes apart what ``gpuquota apply`` made, through the AWS Batch API.

What each does is AWS's (S5.9): a DISABLED quota share or job queue accepts no new jobs while its
queued and running jobs go on; only a DISABLED one can be deleted (the refusal says so, and which
command disables it); deleting a share terminates its jobs (queued ones fail at once, running ones
are stopped with the preemption grace) with ``statusReason`` "Quota share NAME deleted"; deleting a
queue deletes its shares with it. Deletion is asynchronous: the resource is DELETING until its
jobs have stopped, then gone. Each command prints what it changed and what follows from it.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError
from gpuquota.ctl.options import add_common
from gpuquota.ctl.render import Style

STATE_COLOURS = {"ENABLED": "green", "DISABLED": "yellow"}
ACTIONS = {
    "disable": "no new jobs; queued and running jobs go on",
    "enable": "accepts jobs again",
    "delete": "must be DISABLED; terminates its jobs",
}


def _add_actions(
    sub: Any, resource: str, name: str, name_help: str, delete_note: str = ""
) -> list[argparse.ArgumentParser]:
    """``disable``, ``enable`` and ``delete``, each naming the ``resource`` by the argument ``name``."""
    parsers = []
    for action, what in ACTIONS.items():
        note = delete_note if action == "delete" else ""
        p = sub.add_parser(action, help=f"{action} a {resource} ({what}{note})")
        p.add_argument(name, metavar=name.upper(), help=name_help)
        parsers.append(p)
    return parsers


def add_share_actions(sub: Any) -> list[argparse.ArgumentParser]:
    """``disable``, ``enable`` and ``delete`` under ``gpuquota shares``."""
    parsers = _add_actions(sub, "quota share", "share", "quota share name")
    for p in parsers:
        p.add_argument(
            "--queue", default=argparse.SUPPRESS, help="its job queue (needed if the name is in two)"
        )
    return parsers


def share_action(api: Api, args: argparse.Namespace, style: Style) -> int:
    queue, arn = _find_share(api, args.share, getattr(args, "queue", None))
    where = f"quota share {args.share} of job queue {queue}"
    if args.shares_command == "delete":
        counts = _job_counts(api, queue, args.share)
        with _hint(f"gpuquota shares disable {args.share} --queue {queue}"):
            api.call("delete_quota_share", quotaShareArn=arn)
        after = f"{counts['queued']} queued job(s) fail, {counts['running']} running job(s) are stopped"
        return _say(args, style, where, "DELETING", after, {"quotaShareArn": arn, **counts})
    state = "DISABLED" if args.shares_command == "disable" else "ENABLED"
    api.call("update_quota_share", quotaShareArn=arn, state=state)
    return _say(args, style, where, state, ACTIONS[args.shares_command], {"quotaShareArn": arn})


def _find_share(api: Api, name: str, queue: str | None) -> tuple[str, str]:
    """(job queue, ARN) of the share ``name``; with no ``queue``, the one queue that has it."""
    queues = sorted({row["jobQueue"] for row in api.shares(queue) if row["quotaShareName"] == name})
    if not queues:
        raise CliError(f"Quota share {name} does not exist" + (f" in job queue {queue}" if queue else ""))
    if len(queues) > 1:
        raise CliError(f"Quota share {name} exists in job queues {', '.join(queues)}: give --queue")
    listed = api.pages("list_quota_shares", "quotaShares", jobQueue=queues[0])
    arn = next(str(s["quotaShareArn"]) for s in listed if s["quotaShareName"] == name)
    return queues[0], arn


def _job_counts(api: Api, queue: str, share: str) -> dict[str, int]:
    """The share's jobs that a deletion terminates: queued (fail) and dispatched (stopped)."""
    filters = [{"name": "QUOTA_SHARE_NAME", "values": [share]}]
    count = {
        status: len(
            api.pages(
                "list_service_jobs", "jobSummaryList", jobQueue=queue, jobStatus=status, filters=filters
            )
        )
        for status in ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")
    }
    return {
        "queued": count["SUBMITTED"] + count["RUNNABLE"],
        "running": sum(count.values()) - count["SUBMITTED"] - count["RUNNABLE"],
    }


class _hint:
    """Adds ``(first: COMMAND)`` to a refusal that asks for a DISABLED resource."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, CliError) and "must be DISABLED" in str(exc):
            raise CliError(f"{exc} (first: {self.command})") from None


def _say(
    args: argparse.Namespace, style: Style, where: str, state: str, after: str, data: dict[str, Any]
) -> int:
    if args.output == "json":
        render.dump_json({**data, "state" if state != "DELETING" else "status": state})
    else:
        print(f"{where}: {style(state, STATE_COLOURS.get(state, 'red'))} ({after})")
    return 0


# ----- queues --------------------------------------------------------------------------------------


def configure_queues(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="queues_command", metavar="SUBCOMMAND")
    listing = sub.add_parser("list", help="list job queues (the default)")
    actions = _add_actions(sub, "job queue", "queue", "job queue name or ARN", "; deletes its quota shares")
    for p in (parser, listing, *actions):
        add_common(p)


def queues_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    action = getattr(args, "queues_command", None) or "list"
    if action == "list":
        return _list_queues(api, args, style)
    queue = _queue(api, args.queue)
    name = queue["jobQueueName"]
    where = f"job queue {name}"
    if action == "delete":
        shares = sorted(row["quotaShareName"] for row in api.shares(name))
        with _hint(f"gpuquota queues disable {name}"):
            api.call("delete_job_queue", jobQueue=name)
        after = (
            f"its quota shares {', '.join(shares)} are deleted with it"
            if shares
            else "it has no quota shares"
        )
        return _say(
            args,
            style,
            where,
            "DELETING",
            after,
            {"jobQueueArn": queue["jobQueueArn"], "quotaShares": shares},
        )
    state = "DISABLED" if action == "disable" else "ENABLED"
    api.call("update_job_queue", jobQueue=name, state=state)
    return _say(args, style, where, state, ACTIONS[action], {"jobQueueArn": queue["jobQueueArn"]})


def _queue(api: Api, ref: str) -> dict[str, Any]:
    found = api.call("describe_job_queues", jobQueues=[ref]).get("jobQueues", [])
    if not found:
        raise CliError(f"Job queue {ref} does not exist")
    return dict(found[0])


def _list_queues(api: Api, args: argparse.Namespace, style: Style) -> int:
    queues = api.pages("describe_job_queues", "jobQueues")
    if render.answered(args.output, "jobQueues", queues, "No job queues."):
        return 0
    shares: dict[str, int] = {}
    for row in api.shares():
        shares[row["jobQueue"]] = shares.get(row["jobQueue"], 0) + 1
    rows = [
        [
            style(q["jobQueueName"], "bold"),
            style(q["state"], STATE_COLOURS.get(q["state"], "dim")),
            q.get("status", "-"),
            str(q.get("priority", "-")),
            str(q["schedulingPolicyArn"]).rsplit("/", 1)[-1],
            ",".join(
                str(e["serviceEnvironment"]).rsplit("/", 1)[-1] for e in q.get("serviceEnvironmentOrder", [])
            ),
            str(shares.get(q["jobQueueName"], 0)),
        ]
        for q in queues
    ]
    headers = ["QUEUE", "STATE", "STATUS", "PRIORITY", "POLICY", "ENVIRONMENT", "SHARES"]
    print(render.table(headers, rows))
    return 0
