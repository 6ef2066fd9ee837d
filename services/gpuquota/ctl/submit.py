"""``gpuquota jobs submit`` and ``gpuquota jobs logs`` (interface I9).

``submit`` builds a ``SubmitServiceJob`` request from flags and either a SageMaker ``CreateTrainingJob``
payload file (``-f``) or a command (``-- CMD ...``, run as-is by a ``process`` node agent), and prints
the new job's id alone, so ``JOB=$(gpuquota jobs submit ...)`` works. ``logs`` reads an attempt's
output through the gateway (``GET /gpuquota/v1/jobs/{job}/logs``), which reads it from the node.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError
from gpuquota.ctl.render import Style

DEFAULT_MAX_RUNTIME = 24 * 3600
FOLLOW_INTERVAL = 0.5


def configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="job queue")
    parser.add_argument("--share", required=True, help="quota share of the queue")
    parser.add_argument("--name", help="job name (default: the payload's TrainingJobName or the command)")
    parser.add_argument("--priority", type=int, default=0, help="scheduling priority 0-9999 (default 0)")
    parser.add_argument("--instances", type=int, help="instances the job needs (default 1)")
    parser.add_argument("--unit", help="capacity unit (instance type); required with a command")
    parser.add_argument("-f", "--file", help="a SageMaker CreateTrainingJob request (JSON) as the payload")
    parser.add_argument("argv", nargs="*", metavar="-- CMD", help="the command to run instead of -f")


def configure_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id or ARN")
    parser.add_argument("--attempt", type=int, help="attempt number, from 1 (default: the latest)")
    parser.add_argument("--follow", action="store_true", help="keep printing until the attempt ends")


# ----- submit --------------------------------------------------------------------------------------


def submit_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    if bool(args.file) == bool(args.argv):
        args.usage_parser.error("give either -f PAYLOAD.json or -- CMD ... (one of them)")
    if args.instances is not None and args.instances < 1:
        raise CliError("--instances must be at least 1")
    payload = _payload_file(args) if args.file else _payload_command(args)
    name = args.name or _default_name(args, payload)
    out = api.call(
        "submit_service_job",
        jobName=name,
        jobQueue=args.queue,
        serviceJobType="SAGEMAKER_TRAINING",
        quotaShareName=args.share,
        schedulingPriority=args.priority,
        serviceRequestPayload=json.dumps(payload),
    )
    if args.output == "json":
        render.dump_json({"jobId": out["jobId"], "jobName": out["jobName"], "jobArn": out.get("jobArn")})
    else:
        print(out["jobId"])
    return 0


def _payload_file(args: argparse.Namespace) -> dict[str, Any]:
    try:
        doc = json.loads(Path(args.file).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"{args.file} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CliError(f"{args.file} must hold a JSON object (a CreateTrainingJob request)")
    config = doc.setdefault("ResourceConfig", {})
    if not isinstance(config, dict):
        raise CliError(f"{args.file}: ResourceConfig must be an object")
    if args.unit:
        config["InstanceType"] = args.unit
    if args.instances is not None:
        config["InstanceCount"] = args.instances
    if not config.get("InstanceType"):
        raise CliError(f"{args.file} has no ResourceConfig.InstanceType: give --unit")
    return doc


def _payload_command(args: argparse.Namespace) -> dict[str, Any]:
    if not args.unit:
        raise CliError("--unit is required with a command (the instance type the job needs)")
    return {
        "TrainingJobName": args.name or "gpuquota-cli",
        "AlgorithmSpecification": {"TrainingInputMode": "File", "ContainerEntrypoint": list(args.argv)},
        "ResourceConfig": {
            "InstanceType": args.unit,
            "InstanceCount": args.instances or 1,
            "VolumeSizeInGB": 1,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": DEFAULT_MAX_RUNTIME},
    }


def _default_name(args: argparse.Namespace, payload: dict[str, Any]) -> str:
    if args.argv:
        base = Path(args.argv[0]).name
    else:
        base = str(payload.get("TrainingJobName") or Path(args.file).stem)
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in base)[:128]
    return name or "job"


# ----- logs ----------------------------------------------------------------------------------------


def logs_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    """Print the attempt's log; with ``--follow``, wait for the first attempt and poll until it ends."""
    if args.attempt is not None and args.attempt < 1:
        raise CliError("--attempt must be at least 1")
    attempt, offset = args.attempt, 0
    while True:
        chunk = api.logs(args.job, attempt, offset)
        if chunk["attempt"] is None and not args.follow:
            raise CliError(f"job {chunk['jobId']} has no attempt yet (status {chunk['status']})")
        if args.output == "json":  # one JSON document per piece read (JSON Lines)
            print(json.dumps(chunk, sort_keys=True), flush=True)
        else:
            sys.stdout.write(chunk["text"])
            sys.stdout.flush()
        offset = int(chunk["nextOffset"])
        if chunk["attempt"] is not None:
            attempt = int(chunk["attempt"])  # follow the attempt we started on, not a later one
        if not args.follow or chunk["complete"]:
            return 0
        if not chunk["text"]:
            time.sleep(FOLLOW_INTERVAL)
