"""Many short jobs that mark their runs, and what the markers prove (the e2e fault tests of issue #30).

Each job is a tiny Python process that appends ``start``, then ``end`` (or ``term`` on SIGTERM) with
the time, its pid and its attempt id to a file of its own, and sleeps a while in between. ``examine``
reads the markers back: no two runs of one job overlap, no job runs again after one of its runs ended
by itself, at no instant do more job processes run than the node has slots (a sweep over the intervals).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from tests.e2e.conftest import G5
from tests.gateway.helpers import submit

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


def ended(out: Path) -> int:
    """How many runs have ended by themselves so far."""
    return sum(1 for p in out.iterdir() if "\nend " in "\n" + p.read_text())


@dataclass
class Findings:
    overlaps: list[tuple[str, str, str]]
    again_after_finish: list[tuple[str, str]]
    unended: list[str]
    most_at_once: int
    slots: int
    jobs_run: int
    """Jobs that ran at least once."""

    def line(self) -> str:
        return (
            f"overlapping runs {len(self.overlaps)}, "
            f"runs after a finished run {len(self.again_after_finish)}, "
            f"unended runs {len(self.unended)}, most processes at once {self.most_at_once} on "
            f"{self.slots} slots"
        )

    def check(self, jobs: int) -> None:
        """No run overlapped another of its job, none followed a finished one, no more ran at once than
        the node has slots, and every one of the ``jobs`` ran."""
        assert not self.overlaps, f"runs of one job overlapped: {self.overlaps[:5]}"
        assert not self.again_after_finish, f"jobs ran again after finishing: {self.again_after_finish[:5]}"
        assert self.most_at_once <= self.slots, self.line()
        assert self.jobs_run == jobs


def examine(runs: list[Run], slots: int) -> Findings:
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
    return Findings(overlaps, again, unended, most, slots, len({r.job_id for r in runs}))


def submit_through(batch: Any, token: str, payload: str) -> str:
    """Submit with clientToken ``token``, again with the same token while the answer is a throttle
    (429: the scheduler is behind while the database is away) or a server error, as a client would."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return submit(batch, token, "QS", serviceRequestPayload=payload, clientToken=token)
        except ClientError as exc:
            code = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500)
            if (code != 429 and code < 500) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # back-off before submitting again (boto3 gave up after its own retries)


def submit_marking_jobs(batch: Any, root: Path, jobs: int) -> dict[str, str]:
    """Submits ``jobs`` marking jobs ``j0``, ``j1``... of 0.2 to 1 s each (``submit_through``);
    their job ids by name."""
    acknowledged = {}
    for i in range(jobs):
        payload = marking_payload(root, 0.2 + 0.8 * ((i * 7) % 10) / 9)  # 0.2 to 1 s
        acknowledged[f"j{i}"] = submit_through(batch, f"j{i}", payload)
    return acknowledged
