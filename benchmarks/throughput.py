"""Start rate of the embedded stack: ``python -m benchmarks.throughput --slots 64 --jobs 1000 --duration 0.5``

(``--json`` prints one JSON object.)

Server: ``gpuquota up --nodes ml.g5.xlarge=SLOTS`` in its own process (process runtime, event log in
SQLite under a temporary directory). Setup with boto3: one scheduling policy, one service environment
of SLOTS x ``ml.g5.xlarge``, one job queue and two quota shares of SLOTS / 2 each: ``BORROW``
(LEND_AND_BORROW, unlimited borrowing) and ``LEND`` (LEND). While ``LEND`` is idle, ``BORROW`` runs
SLOTS jobs at once.

Phase 1 (starts): JOBS jobs of ``--duration`` seconds in ``BORROW``, each a short shell command,
``busybox sh -c 'echo "$EPOCHREALTIME $$" > DIR/$GPUQUOTA_JOB_ID.start; sleep DURATION'``: every job
writes its own start time (``--job-command date``: ``sh -c 'date +%s.%N > ...; sleep DURATION'``).
They are submitted one ``SubmitServiceJob`` request each, from ``--clients`` threads (16 by default)
with a boto3 client each; then the benchmark waits for every job to succeed. The pool, not the client,
is to be the limit: each request waits for the server's group commit (tens of milliseconds on a busy
machine), so 4 threads submitted only 30-75 jobs a second, below the pool's 128 starts a second; 16
submitted 166-370 a second on the 2-core development machine (32 were no faster there).

- ``submits_per_s``: JOBS over the time from the first submission to the last answer;
- ``starts_per_s``: JOBS over the time from the first written start to the end of the last job's run
  (its start plus ``--duration``): how fast the pool turned over. With instant starts it approaches
  ``ideal_starts_per_s`` = SLOTS / DURATION from below (1,000 jobs on 64 slots: 16 waves, 125/s);
- ``submit_to_start_p50_s``, ``submit_to_start_p99_s``: from the submission request's sending to the
  start the job wrote (queueing included: the pool is the limit, so later jobs wait for slots);
- CPU per job during phase 1: ``server_cpu_ms_per_job`` (the server process), ``jobs_cpu_ms_per_job``
  (the jobs' own processes: exit wrapper and command), ``client_cpu_ms_per_job`` (this process;
  ``client_cpu_ms_per_submit``: while it submits). The three share the machine's cores;
- ``host_cpu_seconds``: the whole machine's CPU seconds during both phases (``busy``, ``idle``, and
  ``steal``: the time the hypervisor gave its vCPUs to other machines while they had work), and
  ``calibration_ms``, a fixed piece of pure-Python work timed just before and after them (the
  machine's speed at the moment, ``benchmarks.server_cpu.calibration_ms``).

Phase 2 (preemption): SLOTS long jobs in ``BORROW`` borrow the whole pool; once all have started, one
job arrives in ``LEND``, which reclaims its share: ``preemption_to_start_s`` is the time from that
submission to the start the job wrote (the victim is stopped with SIGTERM first). The long jobs are
then terminated.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.gateway import Server, create_queue
from benchmarks.report import print_result
from benchmarks.server_cpu import HostCpu, process_cpu_seconds

UNIT = "ml.g5.xlarge"
QUEUE = "throughput"
BORROW, LEND = "BORROW", "LEND"
LONG_SECONDS = 300


def batch_client(url: str) -> Any:
    """A boto3 Batch client for ``url`` at its cheapest: authentication is off, so requests go unsigned
    (SigV4 signing is most of boto3's CPU per request) and parameters are not validated client-side."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(signature_version=UNSIGNED, parameter_validation=False, retries={"max_attempts": 0})
    return boto3.client("batch", endpoint_url=url, region_name="us-east-1", config=config)


def setup(url: str, slots: int) -> None:
    batch = batch_client(url)
    create_queue(batch, QUEUE, UNIT, slots)
    half = slots // 2
    for name, sharing, limit in (
        (BORROW, {"strategy": "LEND_AND_BORROW", "borrowLimit": -1}, slots - half),
        (LEND, {"strategy": "LEND"}, half),
    ):
        batch.create_quota_share(
            quotaShareName=name,
            jobQueue=QUEUE,
            capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": limit}],
            resourceSharingConfiguration=sharing,
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
    batch.close()


def payload(job: list[str]) -> str:
    return json.dumps(
        {
            "TrainingJobName": "throughput",
            "AlgorithmSpecification": {
                "TrainingImage": "local",
                "TrainingInputMode": "File",
                "ContainerEntrypoint": job[:-1],
                "ContainerArguments": job[-1:],
            },
            "ResourceConfig": {"InstanceType": UNIT, "InstanceCount": 1, "VolumeSizeInGB": 30},
            "RoleArn": "arn:aws:iam::000000000000:role/training",
            "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        }
    )


#: ``--job-command``: what each job runs (``DIR/$GPUQUOTA_JOB_ID.start`` gets its start time and pid)
JOB_COMMANDS = ("builtin", "date")


def job_command(kind: str, starts: Path, seconds: float) -> list[str]:
    """The job's command: it writes its start time and its pid (for the benchmark's clean-up) before it
    sleeps. ``builtin`` (default): busybox's shell takes the time itself (``$EPOCHREALTIME``) and, as
    the last command of ``-c``, execs its ``sleep``: one process. ``date`` (sessions 4-6): ``sh`` forks
    ``date`` and then ``sleep``, three processes, and the pid in a second file."""
    job = f'{starts}/"$GPUQUOTA_JOB_ID"'
    if kind == "builtin":
        return ["busybox", "sh", "-c", f'echo "$EPOCHREALTIME $$" > {job}.start; sleep {seconds}']
    return ["sh", "-c", f"date +%s.%N > {job}.start; echo $$ > {job}.pid; sleep {seconds}"]


class Submitter:
    """``jobs`` submissions, one request each, spread over ``clients`` threads with a boto3 client each."""

    def __init__(self, url: str, clients: int) -> None:
        self.local = threading.local()
        self.url = url
        self.pool = ThreadPoolExecutor(clients)

    def _client(self) -> Any:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = batch_client(self.url)
        return client

    def _submit(self, name: str, share: str, body: str) -> tuple[str, float]:
        sent = time.time()
        answer = self._client().submit_service_job(
            jobName=name,
            jobQueue=QUEUE,
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName=share,
            schedulingPriority=1,
            serviceRequestPayload=body,
        )
        return str(answer["jobId"]), sent

    def submit(self, count: int, share: str, body: str, prefix: str) -> dict[str, float]:
        """Job id -> the time its submission was sent."""
        futures = [self.pool.submit(self._submit, f"{prefix}-{i}", share, body) for i in range(count)]
        return dict(f.result() for f in futures)

    def warm(self, clients: int) -> None:
        """Creates each thread's client (botocore's model loading is not part of the measure)."""
        barrier = threading.Barrier(clients)

        def make() -> None:
            self._client()
            barrier.wait()

        for f in [self.pool.submit(make) for _ in range(clients)]:
            f.result()


def read_starts(starts: Path, job_ids: list[str]) -> dict[str, float]:
    found: dict[str, float] = {}
    written = {entry.name for entry in os.scandir(starts)}
    for job_id in job_ids:
        if f"{job_id}.start" not in written:
            continue
        try:
            text = (starts / f"{job_id}.start").read_text().strip()
        except FileNotFoundError:
            continue
        if text:
            found[job_id] = float(text.split()[0])
    return found


def wait_for_starts(starts: Path, job_ids: list[str], timeout: float) -> dict[str, float]:
    """Every job's written start. One directory listing every 0.2 s, and only the new files read: trying
    every file every 50 ms cost the benchmark process about 1.5 ms of CPU per job, taken from the cores
    the server and the jobs share (the times are the jobs' own: polling less often changes none)."""
    deadline = time.monotonic() + timeout
    found: dict[str, float] = {}
    while True:
        found |= read_starts(starts, [j for j in job_ids if j not in found])
        if len(found) == len(job_ids):
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(found)} of {len(job_ids)} jobs wrote their start in {timeout:g} s")
        time.sleep(0.2)


def count_status(batch: Any, status: str) -> int:
    pages = batch.get_paginator("list_service_jobs").paginate(
        jobQueue=QUEUE, jobStatus=status, PaginationConfig={"PageSize": 100}
    )
    return sum(len(page["jobSummaryList"]) for page in pages)


def wait_until_done(batch: Any, jobs: int, timeout: float) -> int:
    """Waits until ``jobs`` jobs ended (SUCCEEDED or FAILED); returns the failures."""
    deadline = time.monotonic() + timeout
    while True:
        failed = count_status(batch, "FAILED")
        if count_status(batch, "SUCCEEDED") + failed >= jobs:
            return failed
        if time.monotonic() > deadline:
            raise SystemExit(f"not every job ended within {timeout:g} s")
        time.sleep(0.2)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def starts_phase(url: str, args: argparse.Namespace, submitter: Submitter, starts: Path) -> dict[str, Any]:
    body = payload(job_command(args.job_command, starts, args.duration))
    began, cpu = time.time(), time.process_time()
    submitted = submitter.submit(args.jobs, BORROW, body, "job")
    submit_seconds = time.time() - began
    client_cpu_ms = (time.process_time() - cpu) * 1000 / args.jobs
    started = wait_for_starts(starts, list(submitted), 60 + 10 * args.jobs * args.duration / args.slots)
    batch = batch_client(url)
    failed = wait_until_done(batch, args.jobs, 60 + args.duration * 10)
    batch.close()
    phase_cpu_ms = (time.process_time() - cpu) * 1000 / args.jobs
    delays = [started[j] - submitted[j] for j in submitted]
    span = max(started.values()) + args.duration - min(started.values())
    return {
        "submits_per_s": round(args.jobs / submit_seconds, 1),
        "starts_per_s": round(args.jobs / span, 1),
        "ideal_starts_per_s": round(args.slots / args.duration, 1),
        "submit_to_start_p50_s": round(percentile(delays, 0.50), 3),
        "submit_to_start_p99_s": round(percentile(delays, 0.99), 3),
        "client_cpu_ms_per_submit": round(client_cpu_ms, 2),
        "client_cpu_ms_per_job": round(phase_cpu_ms, 2),
        "failed_jobs": failed,
    }


def preemption_phase(url: str, args: argparse.Namespace, submitter: Submitter, starts: Path) -> float:
    long_body = payload(job_command(args.job_command, starts, LONG_SECONDS))
    long_jobs = submitter.submit(args.slots, BORROW, long_body, "long")
    wait_for_starts(starts, list(long_jobs), 120)
    submitted = submitter.submit(1, LEND, payload(job_command(args.job_command, starts, 0)), "lender")
    ((job_id, sent),) = submitted.items()
    started = wait_for_starts(starts, [job_id], 120 + args.slots)
    batch = batch_client(url)
    for long_id in long_jobs:
        batch.terminate_service_job(jobId=long_id, reason="benchmark over")
    batch.close()
    return started[job_id] - sent


def kill_leftovers(starts: Path) -> None:
    """Ends what a job left behind (the long jobs if their termination did not go through): only a
    process group whose leader (the job's exit wrapper) names this run's directory on its command line
    (its exit file), so a reused pid is never signalled. The pid is in the job's ``.pid`` file (``date``
    command) or after its start time (``builtin``)."""
    run_dir = str(starts.parent).encode()
    for written in [*starts.glob("*.pid"), *starts.glob("*.start")]:
        try:
            pid = int(written.read_text().split()[-1])
            group = os.getpgid(pid)
            if run_dir in Path(f"/proc/{group}/cmdline").read_bytes():
                os.killpg(group, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue


def children_cpu_seconds(pid: int) -> float:
    """User + system CPU of the children ``pid`` has waited for (with theirs): the server reaps every
    attempt's exit wrapper, which reaps the job's command, so this is the CPU of the jobs' processes."""
    return process_cpu_seconds(pid, waited_children=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpuquota-throughput-") as tmp:
        starts = Path(tmp) / "starts"
        starts.mkdir()
        command = ["-m", "gpuquota", "up", "--port", "0", "--data-dir", str(Path(tmp) / "data")]
        server = Server([*command, "--nodes", f"{UNIT}={args.slots}"], args.profile)
        try:
            setup(server.url, args.slots)
            submitter = Submitter(server.url, args.clients)
            submitter.warm(args.clients)
            result: dict[str, Any] = {"jobs": args.jobs, "slots": args.slots, "duration": args.duration}
            result["job_command"] = args.job_command
            host = HostCpu(calibrate=True).start()
            cpu_before, jobs_cpu_before = server.cpu_seconds(), children_cpu_seconds(server.process.pid)
            result.update(starts_phase(server.url, args, submitter, starts))
            result["server_cpu_ms_per_job"] = round((server.cpu_seconds() - cpu_before) * 1000 / args.jobs, 2)
            jobs_cpu = children_cpu_seconds(server.process.pid) - jobs_cpu_before
            result["jobs_cpu_ms_per_job"] = round(jobs_cpu * 1000 / args.jobs, 2)
            result["preemption_to_start_s"] = round(preemption_phase(server.url, args, submitter, starts), 3)
            host.stop()
            result.update(host.readings())
            submitter.pool.shutdown()
        finally:
            server.stop()
            kill_leftovers(starts)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--slots", type=int, default=64, help="ml.g5.xlarge slots of the one local node")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of the start phase")
    parser.add_argument("--duration", type=float, default=0.5, help="seconds each job sleeps")
    parser.add_argument(
        "--clients", type=int, default=16, help="submitting threads (one boto3 client each; default 16)"
    )
    parser.add_argument(
        "--job-command",
        choices=JOB_COMMANDS,
        default="builtin",
        help="builtin: busybox sh writes the start with $EPOCHREALTIME and execs sleep (one process); "
        "date: sh, date and sleep (sessions 4-6)",
    )
    parser.add_argument("--profile", metavar="FILE", help="run the server under cProfile, stats to FILE")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.slots < 2 or args.jobs < 1 or args.duration <= 0:
        parser.error("--slots must be at least 2, --jobs at least 1 and --duration positive")
    print_result(run(args), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
