"""Benchmark of the AWS Batch gateway: ``python -m benchmarks.gateway --seconds S --json``.

Server: ``gpuquota up`` in its own process, embedded mode (event log in SQLite under a temporary
directory), one local node agent with the ``simulated`` runtime offering ``ml.g5.xlarge`` x 3. Setup as in
the worked example (scheduling policy, service environment g5 x 3, job queue ``jq``, quota shares QS1
LEND_AND_BORROW 200 % with in-share preemption, QS2 LEND, QS3 RESERVE, one instance each), made with boto3.

Load: ``--clients`` concurrent closed-loop clients in this process, each on its own keep-alive connection.
They send exactly what botocore sends (``POST /v1/submitservicejob`` and ``/v1/describeservicejob``, JSON
bodies), without signatures since authentication is off. ``--client raw`` (default): HTTP/1.1 written and
read by hand on asyncio streams, the cheapest client, so that on a small machine the client leaves the
server as much CPU as possible. ``--client aiohttp``: an ``aiohttp`` client session. ``--client boto3``: a
thread pool of unmodified boto3 clients (signed requests; client-bound on a small machine).

Phase 1 submits jobs (names, priorities 0-9, the three shares in turn; simulated attempts last 1 s) for
``--seconds``; phase 2 describes random submitted jobs for ``--seconds``. Each phase is preceded by
``--warmup`` seconds that are not measured. Latency is per request, from sending to the whole response.
``*_server_cpu_ms_per_request`` is the server process's CPU time (user + system, all threads) divided by
the requests of the phase, ``*_client_cpu_ms_per_request`` the same for this process;
``*_host_cpu_seconds`` is the whole machine's (``busy``, ``idle``, and ``steal``: the time the
hypervisor gave its vCPUs to other machines while they had work; ``benchmarks.server_cpu.HostCpu``).
``calibration_ms``: a fixed piece of pure-Python work timed in this process before and after the
phases, the machine's speed at the moment (``benchmarks.server_cpu.calibration_ms``).
``submit_appends``, ``submit_inputs_per_append`` and ``submit_append_mean_ms`` are the server's own
figures for the appends to its event log during the submit phase (warm-up included), from ``/metrics``:
whether the wait for the log or the event loop's CPU limits the rate.

``--baseline``: the same clients against a bare ``aiohttp`` server answering a fixed JSON body (no
gateway, no scheduler): what the machine allows at that moment, for reading the numbers on a busy box.
``--store memory`` keeps the server's event log in memory (diagnosis); ``--profile FILE`` runs the
server under ``cProfile`` and writes its stats to FILE when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit
from urllib.request import urlopen

from benchmarks.report import print_result
from benchmarks.server_cpu import HostCpu, calibration_ms, process_cpu_seconds

QUEUE = "jq"
SHARES = ("QS1", "QS2", "QS3")
UNIT = "ml.g5.xlarge"
PAYLOAD = json.dumps(
    {
        "TrainingJobName": "bench",
        "AlgorithmSpecification": {"TrainingImage": "train:latest", "TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": UNIT, "InstanceCount": 1, "VolumeSizeInGB": 30},
        "RoleArn": "arn:aws:iam::000000000000:role/training",
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": "1"},
    }
)
BASELINE_BODY = json.dumps(
    {
        "jobArn": f"arn:aws:batch:us-east-1:000000000000:service-job/{'0' * 36}",
        "jobName": "j",
        "jobId": "0" * 36,
    }
)

One = Callable[[], Awaitable[tuple[bool, float]]]
"""One request of a client: (answered 200, latency in seconds)."""


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    client_cpu_seconds: float = 0.0
    host: HostCpu = field(default_factory=HostCpu)
    began: tuple[float, float] = (0.0, 0.0)

    def begin(self, server: Server) -> None:
        """The measured window starts (after the warm-up): CPU readings of both sides and the host."""
        self.began = (server.cpu_seconds(), time.process_time())
        self.host.start()

    def end(self, server: Server, seconds: float) -> None:
        self.seconds = seconds
        self.cpu_seconds = server.cpu_seconds() - self.began[0]
        self.client_cpu_seconds = time.process_time() - self.began[1]
        self.host.stop()

    def summary(self, name: str) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        n = len(ordered)

        def pct(p: float) -> float:
            return round(ordered[min(n - 1, int(p * n))] * 1000, 2) if n else 0.0

        def per_request(seconds: float) -> float:
            return round(seconds * 1000 / n, 3) if n else 0.0

        return {
            f"{name}s": n,
            f"{name}s_per_s": round(n / self.seconds, 1) if self.seconds else 0.0,
            f"{name}_p50_ms": pct(0.50),
            f"{name}_p99_ms": pct(0.99),
            f"{name}_max_ms": round(ordered[-1] * 1000, 2) if n else 0.0,
            f"{name}_errors": self.errors,
            f"{name}_server_cpu_ms_per_request": per_request(self.cpu_seconds),
            f"{name}_client_cpu_ms_per_request": per_request(self.client_cpu_seconds),
            f"{name}_host_cpu_seconds": self.host.seconds,
        }


class Server:
    """The server in a child process: ``gpuquota up``, or this module's ``--serve-*`` modes."""

    def __init__(self, command: list[str], profile: str | None) -> None:
        prefix = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
        env = {**os.environ, "GPUQUOTA_LOG_LEVEL": "WARNING"}
        env.pop("GPUQUOTA_AUTH_KEYS", None)
        self.process = subprocess.Popen(prefix + command, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until the ready line (or EOF if it failed)
        if not line.startswith("gpuquota ready on "):
            self.process.kill()
            raise SystemExit(f"the server did not start: {line!r}")
        self.url = line.split()[-1]

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def create_queue(batch: Any, queue: str, unit: str, capacity: int) -> None:
    """Scheduling policy ``policy``, service environment ``se`` (``capacity`` x ``unit``) and ``queue``."""
    batch.create_scheduling_policy(name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName="se",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": unit, "maxCapacity": capacity}],
    )
    batch.create_job_queue(
        jobQueueName=queue,
        priority=1,
        jobQueueType="SAGEMAKER_TRAINING",
        schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )


def setup(url: str) -> None:
    import boto3

    batch = boto3.client(
        "batch", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )
    create_queue(batch, QUEUE, UNIT, 3)
    for name, strategy, borrow, in_share in (
        ("QS1", "LEND_AND_BORROW", 200, "ENABLED"),
        ("QS2", "LEND", None, "DISABLED"),
        ("QS3", "RESERVE", None, "DISABLED"),
    ):
        sharing: dict[str, Any] = {"strategy": strategy}
        if borrow is not None:
            sharing["borrowLimit"] = borrow
        batch.create_quota_share(
            quotaShareName=name,
            jobQueue=QUEUE,
            capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": 1}],
            resourceSharingConfiguration=sharing,
            preemptionConfiguration={"inSharePreemption": in_share},
        )
    batch.close()


class Workload:
    """What the clients send: submissions in turn over the shares, then describes of submitted jobs."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.serial = 0
        self.job_ids: list[str] = []
        self.lock = threading.Lock()

    def submit_body(self) -> dict[str, Any]:
        with self.lock:
            self.serial += 1
            serial = self.serial
        return {
            "jobName": f"bench-{serial}",
            "jobQueue": QUEUE,
            "serviceJobType": "SAGEMAKER_TRAINING",
            "quotaShareName": SHARES[serial % len(SHARES)],
            "schedulingPriority": serial % 10,
            "serviceRequestPayload": PAYLOAD,
        }

    def describe_body(self) -> dict[str, Any]:
        with self.lock:
            return {"jobId": self.rng.choice(self.job_ids)}

    def body(self, operation: str) -> Callable[[], dict[str, Any]]:
        return self.submit_body if operation == "submitservicejob" else self.describe_body

    def answered(self, operation: str, data: bytes) -> None:
        if operation == "submitservicejob":
            self.job_ids.append(json.loads(data)["jobId"])


# ----- asyncio clients: raw HTTP/1.1 or aiohttp -------------------------------------------------

_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


async def raw_clients(url: str, operation: str, workload: Workload, clients: int) -> list[One]:
    """One keep-alive connection per client; requests and responses handled by hand."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = workload.body(operation)
    head = f"POST /v1/{operation} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"

    async def client() -> One:
        reader, writer = await asyncio.open_connection(host, port)

        async def one() -> tuple[bool, float]:
            data = json.dumps(body()).encode()
            started = time.perf_counter()
            writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
            response = await reader.readuntil(b"\r\n\r\n")
            length = _LENGTH.search(response)
            answer = await reader.readexactly(int(length[1])) if length else b""
            latency = time.perf_counter() - started
            ok = response.startswith(b"HTTP/1.1 200")
            if ok:
                workload.answered(operation, answer)
            return ok, latency

        return one

    return [await client() for _ in range(clients)]


async def asyncio_phase(
    args: argparse.Namespace, operation: str, workload: Workload, server: Server
) -> Phase:
    if args.client == "raw":
        clients = await raw_clients(server.url, operation, workload, args.clients)
        return await _closed_loop(clients, args.warmup, args.seconds, server)
    import aiohttp

    body = workload.body(operation)
    connector = aiohttp.TCPConnector(limit=args.clients)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(server.url, connector=connector, headers=headers) as session:

        async def one() -> tuple[bool, float]:
            data = json.dumps(body())
            started = time.perf_counter()
            async with session.post(f"/v1/{operation}", data=data) as response:
                answer = await response.read()
                ok = response.status == 200
            latency = time.perf_counter() - started
            if ok:
                workload.answered(operation, answer)
            return ok, latency

        return await _closed_loop([one] * args.clients, args.warmup, args.seconds, server)


async def _closed_loop(clients: list[One], warmup: float, seconds: float, server: Server) -> Phase:
    loop = asyncio.get_running_loop()
    phase = Phase()
    measure_from = loop.time() + warmup
    until = measure_from + seconds

    async def worker(one: One) -> None:
        while (now := loop.time()) < until:
            ok, latency = await one()
            if now < measure_from:
                continue
            if ok:
                phase.latencies.append(latency)
            else:
                phase.errors += 1

    loop.call_at(measure_from, phase.begin, server)
    await asyncio.gather(*(worker(one) for one in clients))
    phase.end(server, loop.time() - measure_from)
    return phase


# ----- boto3 client -----------------------------------------------------------------------------


def boto3_phase(args: argparse.Namespace, operation: str, workload: Workload, server: Server) -> Phase:
    import boto3
    from botocore.exceptions import ClientError

    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y")
    batch = [
        session.client("batch", endpoint_url=server.url, region_name="us-east-1") for _ in range(args.clients)
    ]
    body = workload.body(operation)
    phase = Phase()
    measure_from = time.monotonic() + args.warmup
    until = measure_from + args.seconds
    lock = threading.Lock()

    def worker(index: int) -> None:
        client = batch[index]
        while (now := time.monotonic()) < until:
            started = time.perf_counter()
            ok = True
            try:
                if operation == "submitservicejob":
                    workload.job_ids.append(client.submit_service_job(**body())["jobId"])
                else:
                    client.describe_service_job(**body())
            except ClientError:
                ok = False
            latency = time.perf_counter() - started
            if now >= measure_from:
                with lock:
                    if ok:
                        phase.latencies.append(latency)
                    else:
                        phase.errors += 1

    timer = threading.Timer(measure_from - time.monotonic(), phase.begin, (server,))
    timer.start()
    with ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(worker, range(args.clients)))
    timer.join()
    phase.end(server, time.monotonic() - measure_from)
    for client in batch:
        client.close()
    return phase


# ----- servers ----------------------------------------------------------------------------------


def serve_mode(mode: str) -> int:
    """``--serve-in-memory``: ``gpuquota up`` with the in-memory event store; ``--serve-baseline``: a bare
    aiohttp server answering every POST with a fixed JSON body."""
    from aiohttp import web

    from gpuquota.entrypoints.embedded import EmbeddedStack
    from gpuquota.entrypoints.serve import serve

    if mode == "memory":
        stack = EmbeddedStack(None, port=0, nodes=f"{UNIT}=3", runtime="simulated")
        return asyncio.run(serve(stack.start, stack.stop, lambda: f"gpuquota ready on {stack.url}"))

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BASELINE_BODY.encode(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/{operation}", answer)
    runner = web.AppRunner(app, access_log=None)

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()

    url = lambda: f"gpuquota ready on http://127.0.0.1:{runner.addresses[0][1]}"  # noqa: E731
    return asyncio.run(serve(start, runner.cleanup, url))


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuquota-bench-") as data_dir:
        if args.baseline:
            command = ["-m", "benchmarks.gateway", "--serve", "baseline"]
        elif args.store == "memory":
            command = ["-m", "benchmarks.gateway", "--serve", "memory"]
        else:
            command = ["-m", "gpuquota", "up", "--port", "0", "--data-dir", data_dir]
            command += ["--runtime", "simulated", "--nodes", f"{UNIT}=3"]
        server = Server(command, args.profile)
        workload = Workload(args.seed)
        phases: dict[str, Phase] = {}
        appends: dict[str, float] = {}
        calibration = [calibration_ms()]
        try:
            if not args.baseline:
                setup(server.url)
            for name, operation in (("submit", "submitservicejob"), ("describe", "describeservicejob")):
                if args.baseline:
                    workload.job_ids.append("x")
                before = appended(server.url) if name == "submit" and not args.baseline else None
                if args.client == "boto3":
                    phases[name] = boto3_phase(args, operation, workload, server)
                else:
                    phases[name] = asyncio.run(asyncio_phase(args, operation, workload, server))
                if before is not None:
                    appends = append_summary(before, appended(server.url))
            calibration.append(calibration_ms())
        finally:
            server.stop()
    clients = {"raw": "raw HTTP/1.1 on asyncio streams", "aiohttp": "aiohttp", "boto3": "boto3 thread pool"}
    signed = ", signed" if args.client == "boto3" else ", unsigned"
    result: dict[str, Any] = {
        "server": "bare aiohttp (baseline)"
        if args.baseline
        else f"gpuquota up: embedded, {args.store} event log, simulated runtime, ml.g5.xlarge x 3, QS1-QS3",
        "client": clients[args.client] + signed,
        "clients": args.clients,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "calibration_ms": calibration,
    }
    result.update(phases["submit"].summary("submit"))
    result.update(appends)
    result.update(phases["describe"].summary("describe"))
    return result


def appended(url: str) -> tuple[float, float, float]:
    """The server's log appends so far, from its ``/metrics``: (seconds, appends, inputs appended)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return (
        samples.get("gpuquota_log_append_seconds_sum", 0.0),
        samples.get("gpuquota_log_append_seconds_count", 0.0),
        samples.get("gpuquota_log_append_batch_size_sum", 0.0),
    )


def append_summary(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict[str, float]:
    """The submit phase's appends (warm-up included): how many, inputs per append, mean time each."""
    seconds, count, inputs = (a - b for a, b in zip(after, before, strict=True))
    return {
        "submit_appends": count,
        "submit_inputs_per_append": round(inputs / count, 2) if count else 0.0,
        "submit_append_mean_ms": round(seconds * 1000 / count, 3) if count else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each phase")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    parser.add_argument("--client", choices=("raw", "aiohttp", "boto3"), default="raw")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--store", choices=("sqlite", "memory"), default="sqlite", help="the server's event log"
    )
    parser.add_argument("--baseline", action="store_true", help="a bare aiohttp server instead of gpuquota")
    parser.add_argument("--profile", metavar="FILE", help="run the server under cProfile, stats to FILE")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", choices=("memory", "baseline"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_mode(args.serve)
    result = run(args)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
