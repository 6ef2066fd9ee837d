"""Benchmark of the AWS Batch gateway: ``python -m benchmarks.gateway --seconds S --json``.

Server: ``gpuquota up`` in its own process, embedded mode (event log in SQLite under a temporary
directory), one local node agent with the ``simulated`` runtime offering ``ml.g5.xlarge`` x 3. Setup as in
the worked example (scheduling policy, service environment g5 x 3, job queue ``jq``, quota shares QS1
LEND_AND_BORROW 200 % with in-share preemption, QS2 LEND, QS3 RESERVE, one instance each), made with boto3.

Load: ``--clients`` concurrent closed-loop clients in this process. ``--client aiohttp`` (default): one
asyncio ``aiohttp`` session sending exactly what botocore sends (``POST /v1/submitservicejob`` and
``/v1/describeservicejob``, JSON bodies) without signatures, since authentication is off; it is much
cheaper per request than boto3, so the client does not eat the server's CPU. ``--client boto3``: a thread
pool of unmodified boto3 clients (signed requests; client-bound on a small machine). Phase 1 submits jobs
(names, priorities 0-9, the three shares in turn; simulated attempts last 1 s) for ``--seconds``; phase 2
describes random submitted jobs for ``--seconds``. Each phase is preceded by ``--warmup`` seconds that are
not measured. Latency is per request, from sending to the whole response. ``server_cpu_ms_per_request``
is the server process's CPU time (user + system, all threads) divided by the requests of the phase.

``--profile FILE`` runs the server under ``cProfile`` and writes its stats to FILE when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def summary(self, name: str) -> dict[str, float | int]:
        ordered = sorted(self.latencies)
        n = len(ordered)

        def pct(p: float) -> float:
            return round(ordered[min(n - 1, int(p * n))] * 1000, 2) if n else 0.0

        return {
            f"{name}s": n,
            f"{name}s_per_s": round(n / self.seconds, 1) if self.seconds else 0.0,
            f"{name}_p50_ms": pct(0.50),
            f"{name}_p99_ms": pct(0.99),
            f"{name}_max_ms": round(ordered[-1] * 1000, 2) if n else 0.0,
            f"{name}_errors": self.errors,
            f"{name}_server_cpu_ms_per_request": round(self.cpu_seconds * 1000 / n, 3) if n else 0.0,
        }


class Server:
    """``gpuquota up`` (embedded, simulated runtime) in a child process."""

    def __init__(self, data_dir: str | None, profile: str | None) -> None:
        command = [sys.executable]
        if profile:
            command += ["-m", "cProfile", "-o", profile]
        if data_dir is None:  # the event log in memory: what the gateway and shell cost without SQLite
            command += ["-m", "benchmarks.gateway", "--serve-in-memory"]
        else:
            command += ["-m", "gpuquota.cli", "up", "--port", "0", "--data-dir", data_dir]
            command += ["--runtime", "simulated", "--nodes", f"{UNIT}=3"]
        env = {**os.environ, "GPUQUOTA_LOG_LEVEL": "WARNING"}
        env.pop("GPUQUOTA_AUTH_KEYS", None)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until the ready line (or EOF if it failed)
        if not line.startswith("gpuquota ready on "):
            self.process.kill()
            raise SystemExit(f"gpuquota up did not start: {line!r}")
        self.url = line.split()[-1]

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def setup(url: str) -> None:
    import boto3

    batch = boto3.client(
        "batch", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
    )
    batch.create_scheduling_policy(name="policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName="se",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": 3}],
    )
    batch.create_job_queue(
        jobQueueName=QUEUE,
        priority=1,
        jobQueueType="SAGEMAKER_TRAINING",
        schedulingPolicyArn="arn:aws:batch:us-east-1:000000000000:scheduling-policy/policy",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )
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


# ----- aiohttp client ---------------------------------------------------------------------------


async def aiohttp_phase(
    url: str, operation: str, clients: int, warmup: float, seconds: float, workload: Workload, server: Server
) -> Phase:
    import aiohttp

    body = workload.submit_body if operation == "submitservicejob" else workload.describe_body
    phase = Phase()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, connector=connector, headers=headers) as session:

        async def one() -> tuple[bool, float]:
            started = time.perf_counter()
            async with session.post(f"/v1/{operation}", data=json.dumps(body())) as response:
                data = await response.read()
                ok = response.status == 200
            if ok and operation == "submitservicejob":
                workload.job_ids.append(json.loads(data)["jobId"])
            return ok, time.perf_counter() - started

        await _closed_loop(one, clients, warmup, seconds, phase, server)
    return phase


async def _closed_loop(
    one: Callable[[], Awaitable[tuple[bool, float]]],
    clients: int,
    warmup: float,
    seconds: float,
    phase: Phase,
    server: Server,
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + warmup
    until = measure_from + seconds
    cpu_before: list[float] = []

    async def worker() -> None:
        while (now := loop.time()) < until:
            ok, latency = await one()
            if now < measure_from:
                continue
            if ok:
                phase.latencies.append(latency)
            else:
                phase.errors += 1

    def mark() -> None:
        cpu_before.append(server.cpu_seconds())

    loop.call_at(measure_from, mark)
    await asyncio.gather(*(worker() for _ in range(clients)))
    phase.seconds = loop.time() - measure_from
    phase.cpu_seconds = server.cpu_seconds() - cpu_before[0]


# ----- boto3 client -----------------------------------------------------------------------------


def boto3_phase(
    url: str, operation: str, clients: int, warmup: float, seconds: float, workload: Workload, server: Server
) -> Phase:
    import boto3
    from botocore.exceptions import ClientError

    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="y")
    batch = [session.client("batch", endpoint_url=url, region_name="us-east-1") for _ in range(clients)]
    phase = Phase()
    measure_from = time.monotonic() + warmup
    until = measure_from + seconds
    lock = threading.Lock()

    def worker(index: int) -> None:
        client = batch[index]
        while (now := time.monotonic()) < until:
            started = time.perf_counter()
            ok = True
            try:
                if operation == "submitservicejob":
                    job_id = client.submit_service_job(**workload.submit_body())["jobId"]
                    workload.job_ids.append(job_id)
                else:
                    client.describe_service_job(**workload.describe_body())
            except ClientError:
                ok = False
            latency = time.perf_counter() - started
            if now >= measure_from:
                with lock:
                    if ok:
                        phase.latencies.append(latency)
                    else:
                        phase.errors += 1

    cpu: list[float] = []
    timer = threading.Timer(measure_from - time.monotonic(), lambda: cpu.append(server.cpu_seconds()))
    timer.start()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    timer.join()
    phase.seconds = time.monotonic() - measure_from
    phase.cpu_seconds = server.cpu_seconds() - cpu[0]
    for client in batch:
        client.close()
    return phase


# ----- main -------------------------------------------------------------------------------------


def serve_in_memory() -> int:
    """``gpuquota up`` with the in-memory event store (``--store memory``)."""
    from gpuquota.distributed import serve
    from gpuquota.embedded import EmbeddedStack

    stack = EmbeddedStack(None, port=0, nodes=f"{UNIT}=3", runtime="simulated")
    return asyncio.run(serve(stack.start, stack.stop, lambda: f"gpuquota ready on {stack.url}"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuquota-bench-") as data_dir:
        server = Server(data_dir if args.store == "sqlite" else None, args.profile)
        try:
            setup(server.url)
            workload = Workload(args.seed)
            phases: dict[str, Phase] = {}
            for name, operation in (("submit", "submitservicejob"), ("describe", "describeservicejob")):
                common = (server.url, operation, args.clients, args.warmup, args.seconds, workload, server)
                if args.client == "aiohttp":
                    phases[name] = asyncio.run(aiohttp_phase(*common))
                else:
                    phases[name] = boto3_phase(*common)
        finally:
            server.stop()
    result: dict[str, Any] = {
        "mode": f"embedded ({args.store} event log, simulated runtime, ml.g5.xlarge x 3, shares QS1-QS3)",
        "client": "aiohttp, unsigned" if args.client == "aiohttp" else "boto3 thread pool, signed",
        "clients": args.clients,
        "seconds": args.seconds,
        "cpus": os.cpu_count(),
        "jobs_submitted": len(workload.job_ids),
    }
    result.update(phases["submit"].summary("submit"))
    result.update(phases["describe"].summary("describe"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each phase")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    parser.add_argument("--client", choices=("aiohttp", "boto3"), default="aiohttp")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", metavar="FILE", help="run the server under cProfile, stats to FILE")
    parser.add_argument(
        "--store", choices=("sqlite", "memory"), default="sqlite", help="the server's event log (diagnosis)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve-in-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_in_memory:
        return serve_in_memory()
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
