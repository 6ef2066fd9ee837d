"""``gpuquota jobs submit`` and ``gpuquota jobs logs`` (interface I9).

``submit`` builds a ``SubmitServiceJob`` request from flags and either a SageMaker ``CreateTrainingJob``
payload file (``-f``) or a command (``-- CMD ...``, run as-is by a ``process`` node agent; with
``--image``, the ``ContainerEntrypoint`` of that image under the ``container`` runtime), and prints
the new job's id alone, so ``JOB=$(gpuquota jobs submit ...)`` works. ``logs`` reads an attempt's
output through the gateway (``GET /gpuquota/v1/jobs/{job}/logs``), which reads it from the node.

Submit directory: like ``sbatch``, the payload's ``Environment`` names the directory the job was
submitted from (``GPUQUOTA_SUBMIT_DIR``, unless the payload file names one); a ``process`` agent
runs the command there when that directory exists on its node, else in the attempt's directory
(its log's first line says so: ``gpuquota.node_agent.instances``). A container runs in its image's
working directory. ``submit -- CMD`` says on stderr which of the two to expect, from the addresses
of the nodes that offer the unit.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError
from gpuquota.ctl.render import Style

DEFAULT_MAX_RUNTIME = 24 * 3600
SUBMIT_DIR = "GPUQUOTA_SUBMIT_DIR"
"""The ``Environment`` variable naming the submit directory (read by ``gpuquota.node_agent.instances``)."""
FOLLOW_INTERVAL = 0.5


def configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="job queue")
    parser.add_argument("--share", required=True, help="quota share of the queue")
    parser.add_argument("--name", help="job name (default: the payload's TrainingJobName or the command)")
    parser.add_argument("--priority", type=int, default=0, help="scheduling priority 0-9999 (default 0)")
    parser.add_argument("--instances", type=int, help="instances the job needs (default 1)")
    parser.add_argument("--unit", help="capacity unit (instance type); required with a command")
    parser.add_argument("-f", "--file", help="a SageMaker CreateTrainingJob request (JSON) as the payload")
    parser.add_argument(
        "--image",
        help="container runtime: the TrainingImage to run (with -- CMD: CMD is its ContainerEntrypoint)",
    )
    parser.add_argument(
        "argv",
        nargs="*",
        metavar="-- CMD",
        help="the command to run instead of -f; it runs in this directory when its node is on this machine",
    )


def configure_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id or ARN")
    parser.add_argument("--attempt", type=int, help="attempt number, from 1 (default: the latest)")
    parser.add_argument("--follow", action="store_true", help="keep printing until the attempt ends")


# ----- submit --------------------------------------------------------------------------------------


def submit_command(api: Api, args: argparse.Namespace, style: Style) -> int:
    if (args.file and args.argv) or not (args.file or args.argv or args.image):
        args.usage_parser.error("give either -f PAYLOAD.json or -- CMD ... / --image (one of them)")
    if args.instances is not None and args.instances < 1:
        raise CliError("--instances must be at least 1")
    payload = _payload_file(args) if args.file else _payload_command(args)
    submit_dir = os.getcwd()
    environment = payload["Environment"] = payload.get("Environment") or {}
    if not isinstance(environment, dict):
        raise CliError(f"{args.file}: Environment must be an object")
    environment.setdefault(SUBMIT_DIR, submit_dir)
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
    if args.argv and not args.image:
        print(f"gpuquota jobs submit: {where_it_runs(api, args.unit, submit_dir)}", file=sys.stderr)
    if args.output == "json":
        render.dump_json({"jobId": out["jobId"], "jobName": out["jobName"], "jobArn": out.get("jobArn")})
    else:
        print(out["jobId"])
    return 0


def where_it_runs(api: Api, unit: str, submit_dir: str) -> str:
    """Where a ``process`` agent will run the command: here, when every node that offers ``unit`` is on
    this machine (module doc: submit directory)."""
    try:
        nodes = [n for n in api.nodes() if unit in n.get("slots", {})]
    except CliError:  # a gateway without the nodes endpoint: say what is sure
        nodes = []
    local_gateway = _local_host(urllib.parse.urlparse(api.endpoint).hostname or "")
    here = [n["nodeId"] for n in nodes if _local_host(n.get("address") or "", local_gateway)]
    away = [n["nodeId"] for n in nodes if n["nodeId"] not in here]
    if here and not away:
        return f"runs in {submit_dir} (its node is on this machine: {', '.join(here)})"
    elsewhere = f"on {', '.join(away)} (not this machine)" if away else "on a node that is not this machine"
    return (
        f"runs in {submit_dir} where that directory exists; {elsewhere}, where it does not, "
        "in its attempt directory (see jobs logs)"
    )


def _local_host(host: str, empty: bool = False) -> bool:
    """Whether ``host`` names this machine (``empty``: what an empty address means)."""
    if not host:
        return empty
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        if host == "localhost":
            return True
    try:
        mine = {socket.gethostname(), socket.getfqdn()}
        addresses = {info[4][0] for name in mine for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    return host in mine or host in addresses


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
    if args.image:
        algorithm = doc.setdefault("AlgorithmSpecification", {})
        if not isinstance(algorithm, dict):
            raise CliError(f"{args.file}: AlgorithmSpecification must be an object")
        algorithm["TrainingImage"] = args.image
    if args.unit:
        config["InstanceType"] = args.unit
    if args.instances is not None:
        config["InstanceCount"] = args.instances
    if not config.get("InstanceType"):
        raise CliError(f"{args.file} has no ResourceConfig.InstanceType: give --unit")
    return doc


def _payload_command(args: argparse.Namespace) -> dict[str, Any]:
    if not args.unit:
        what = "a command" if args.argv else "--image"
        raise CliError(f"--unit is required with {what} (the instance type the job needs)")
    algorithm: dict[str, Any] = {"TrainingInputMode": "File"}
    if args.argv:
        algorithm["ContainerEntrypoint"] = list(args.argv)
    if args.image:
        algorithm["TrainingImage"] = args.image
    return {
        "TrainingJobName": args.name or "gpuquota-cli",
        "AlgorithmSpecification": algorithm,
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
    elif args.image:
        base = args.image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
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
