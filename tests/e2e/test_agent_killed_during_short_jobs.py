"""``kill -9`` of a node agent three times during many short jobs (issue #30; distributed mode:
``gpuquota scheduler`` and ``gpuquota node-agent`` processes over the real Kafka and PostgreSQL).

Each job is a tiny Python process that appends ``start``, then ``end`` (or ``term`` on SIGTERM) with
the time, its pid and its attempt id to a file of its own, and sleeps 0.2 to 1 s in between. The agent
is killed while RunAttempt commands stream in and started again at once (well before the node-lost
timeout), so every kind of attempt is caught: delivered but not yet recorded, recorded but not yet
launched, running, ended but not yet reported. From the jobs' own markers the test then checks:

- no two runs of one job overlap (the scheduler never starts a job again while its old attempt may run);
- no job runs again after one of its runs ended by itself (a job that finished never runs again);
- at no instant do more job processes run than the node has slots (a sweep over the intervals);
- every run ended (by itself or SIGTERM: nothing was left running);

and ``faults.check_events`` on the log (each job terminal once, no attempt ran twice, no capacity held).
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import G5, ClusterFactory, apoll
from tests.e2e.faults import check_events, settle, setup_queue
from tests.gateway.helpers import submit

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HEARTBEAT_SECONDS = 2.0
SLOTS = 16
JOBS = 400
KILLS = 3

MARKING_JOB = """
import os, signal, time
path = os.path.join(os.environ['OUT_DIR'], os.environ['GPUQUOTA_JOB_ID'])
attempt = os.environ['GPUQUOTA_ATTEMPT_ID']
def mark(kind):
    with open(path, 'a') as f:
        f.write(f'{kind} {time.time():.6f} {os.getpid()} {attempt}\\n')
def term(*_):
    mark('term')
    os._exit(143)
signal.signal(signal.SIGTERM, term)
mark('start')
with open(os.environ['RUNS'], 'a') as f:
    f.write(attempt + '\\n')
time.sleep(float(os.environ['SLEEP']))
mark('end')
"""


def marking_payload(root: Path, sleep: float) -> str:
    return json.dumps(
        {
            "AlgorithmSpecification": {"ContainerEntrypoint": [sys.executable, "-S", "-c", MARKING_JOB]},
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
            "Environment": {
                "OUT_DIR": str(root / "out"),
                "RUNS": str(root / "runs"),
                "SLEEP": f"{sleep:.2f}",
            },
        }
    )


@dataclass
class Run:
    job_id: str
    attempt_id: str
    pid: int
    start: float
    end: float | None = None
    finished: bool = False
    """It ended by itself (``end``), not by SIGTERM (``term``)."""


def read_runs(out: Path) -> list[Run]:
    """Every run of every job, from the jobs' markers (one run per pid)."""
    found: list[Run] = []
    for path in sorted(out.iterdir()):
        by_pid: dict[int, Run] = {}
        for line in path.read_text().splitlines():
            kind, at, pid, attempt = line.split()
            if kind == "start":
                by_pid[int(pid)] = Run(path.name, attempt, int(pid), float(at))
            else:
                run = by_pid[int(pid)]
                run.end, run.finished = float(at), kind == "end"
        found.extend(by_pid.values())
    return found


@dataclass
class Findings:
    overlaps: list[tuple[str, str, str]]
    again_after_finish: list[tuple[str, str]]
    unended: list[str]
    most_at_once: int

    def line(self) -> str:
        return (
            f"overlapping runs {len(self.overlaps)}, "
            f"runs after a finished run {len(self.again_after_finish)}, "
            f"unended runs {len(self.unended)}, most processes at once {self.most_at_once} on {SLOTS} slots"
        )


def examine(runs: list[Run]) -> Findings:
    overlaps, again, unended = [], [], []
    per_job: dict[str, list[Run]] = {}
    for run in runs:
        per_job.setdefault(run.job_id, []).append(run)
        if run.end is None:
            unended.append(run.attempt_id)
    for job_id, mine in per_job.items():
        mine.sort(key=lambda r: r.start)
        for i, earlier in enumerate(mine):
            for later in mine[i + 1 :]:
                if earlier.end is None or later.start < earlier.end:
                    overlaps.append((job_id, earlier.attempt_id, later.attempt_id))
                elif earlier.finished:
                    again.append((job_id, later.attempt_id))
    edges = sorted(
        [(r.start, 1) for r in runs] + [(r.end if r.end is not None else float("inf"), -1) for r in runs],
        key=lambda e: (e[0], e[1]),  # an end and a start at the same instant: the end first
    )
    now = most = 0
    for _, delta in edges:
        now += delta
        most = max(most, now)
    return Findings(overlaps, again, unended, most)


async def test_kill_9_of_the_agent_three_times_during_short_jobs(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cluster = await cluster_factory(HEARTBEAT_SECONDS, grace=2.0)
    node = cluster.node_id("a")
    slots = f"{G5}={SLOTS}"
    agent = cluster.agent(node, slots)
    await agent.start()
    await apoll(lambda: cluster.online() == {node}, 30, "the node to register")
    url = cluster.gateway.url
    await asyncio.to_thread(setup_queue, url, SLOTS)

    def submit_all() -> dict[str, str]:
        acknowledged = {}
        for i in range(JOBS):
            sleep = 0.2 + 0.8 * ((i * 7) % 10) / 9  # 0.2 to 1 s
            payload = marking_payload(tmp_path, sleep)
            acknowledged[f"j{i}"] = submit(
                cluster.batch, f"j{i}", "QS", serviceRequestPayload=payload, clientToken=f"j{i}"
            )
        return acknowledged

    submitting = asyncio.ensure_future(asyncio.to_thread(submit_all))

    def ended() -> int:
        return sum(1 for p in out.iterdir() if "\nend " in "\n" + p.read_text())

    def ended_at_least(count: int) -> bool:
        return ended() >= count

    recoveries = []
    for k in range(1, KILLS + 1):
        share = k * JOBS // (KILLS + 1)
        await apoll(functools.partial(ended_at_least, share), 300, f"{share} jobs to end", 0.2)
        await agent.kill()
        killed, before = time.monotonic(), ended()
        agent = cluster.agent(node, slots, log_name=f"a-{k}")
        await agent.start()
        await apoll(functools.partial(ended_at_least, before + 1), 120, "a job to end after the restart", 0.1)
        recoveries.append(time.monotonic() - killed)

    acknowledged = await submitting
    jobs = list(acknowledged.values())
    await settle(url, jobs, 300, cluster.logs)
    await apoll(lambda: all(r.end is not None for r in read_runs(out)), 30, "every run to end")
    findings = examine(read_runs(out))
    print(f"FAULT kill -9 of the node agent x{KILLS} during {JOBS} short jobs: {findings.line()}")
    print(f"  recovery (kill to the next job ended): {', '.join(f'{r:.1f} s' for r in recoveries)}")
    assert not findings.overlaps, f"runs of one job overlapped: {findings.overlaps[:5]}"
    again = findings.again_after_finish
    assert not again, f"jobs ran again after finishing: {again[:5]}"
    assert findings.most_at_once <= SLOTS, findings.line()
    figures = check_events(await cluster.events(), tmp_path, acknowledged)
    figures.recovery_seconds = recoveries
    print(figures.line(f"kill -9 of the node agent x{KILLS} during {JOBS} short jobs"))
    assert len({r.job_id for r in read_runs(out)}) == JOBS
