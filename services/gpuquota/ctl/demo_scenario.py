"""The scenario of ``gpuquota demo``: the worked example of semantics.md S8 as data.

Its resources (``WORKED_EXAMPLE``, the same as ``deploy/examples/worked-example.yaml``), the job each
submission runs (``job_payload``: a small Python "training" process that checkpoints its step), and the
three steps with the job states each must reach (``STEPS``). ``gpuquota.ctl.demo`` plays and shows them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

G5 = "ml.g5.xlarge"
QUEUE = "my-sm-training-qm-jq"
JOB_SECONDS = 600
TERMINAL = ("SUCCEEDED", "FAILED")
DISPATCHED = ("SCHEDULED", "STARTING", "RUNNING")

WORKED_EXAMPLE: dict[str, Any] = {
    "schedulingPolicy": {"name": "my-qm-scheduling-policy", "idleResourceAssignmentStrategy": "FIFO"},
    "serviceEnvironment": {"name": "my-sm-training-qm-se", "state": "ENABLED", "capacityLimits": {G5: 3}},
    "jobQueue": {"name": QUEUE, "priority": 1, "state": "ENABLED"},
    "quotaShares": [
        {
            "name": "QS1",
            "capacityLimits": {G5: 1},
            "strategy": "LEND_AND_BORROW",
            "borrowLimit": 200,
            "inSharePreemption": "ENABLED",
        },
        {"name": "QS2", "capacityLimits": {G5: 1}, "strategy": "LEND", "inSharePreemption": "DISABLED"},
        {"name": "QS3", "capacityLimits": {G5: 1}, "strategy": "RESERVE", "inSharePreemption": "DISABLED"},
    ],
}
"""The worked example's setup; ``deploy/examples/worked-example.yaml`` says the same (a test checks)."""

JOB_SCRIPT = """\
import os, signal, sys, time
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
path = os.path.join(os.environ.get("SM_CHECKPOINT_DIR", "."), "step")
step = int(open(path).read()) if os.path.exists(path) else 0
name, attempt = os.environ.get("GPUQUOTA_JOB_NAME"), os.environ.get("GPUQUOTA_ATTEMPT")
print(f"{name} attempt {attempt}: starting at step {step}", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while not stopping and time.monotonic() < deadline:
    time.sleep(0.1)
    step += 1
    with open(path, "w") as f:
        f.write(str(step))
print(f"{name}: {'SIGTERM' if stopping else 'done'} at step {step}", flush=True)
"""


def job_payload(python: str, seconds: int = JOB_SECONDS) -> str:
    """A SageMaker CreateTrainingJob request for one ml.g5.xlarge running ``JOB_SCRIPT``."""
    return json.dumps(
        {
            "TrainingJobName": "gpuquota-demo",
            "AlgorithmSpecification": {
                "TrainingInputMode": "File",
                "ContainerEntrypoint": [python, "-c", JOB_SCRIPT, str(seconds)],
            },
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": seconds + 60},
            "Environment": {"GPUQUOTA_SIM_DURATION_SECONDS": str(seconds)},
        }
    )


# ----- expectations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    status: str
    note: str = ""
    preempted: int | None = None
    kind: str | None = None  # cross-share | in-share

    def text(self) -> str:
        out = self.status
        if self.preempted:
            out += f", preempted {self.preempted}x" + (f" ({self.kind})" if self.kind else "")
        return out

    def holds(self, job: dict[str, Any] | None) -> bool:
        if job is None or job["status"] != self.status:
            return False
        if self.preempted is not None and preempted_count(job) != self.preempted:
            return False
        return self.kind is None or preemption_kind(job) == self.kind


@dataclass(frozen=True)
class Step:
    title: str
    expect: dict[str, Expect]
    explain: str
    """The job whose ``gpuquota explain`` the step shows."""
    submits: tuple[tuple[str, str, int], ...] = ()
    """What the step submits first: (job name, quota share, scheduling priority)."""
    updates: tuple[tuple[str, int], ...] = ()
    """Then whose scheduling priority it changes: (job name, new priority)."""

    def act(self, submit: Callable[[str, str, int], None], update: Callable[[str, int], None]) -> None:
        """Does what the step does, through a client's ``submit`` and ``update``."""
        for name, share, priority in self.submits:
            submit(name, share, priority)
        for name, priority in self.updates:
            update(name, priority)


STEPS = (
    Step(
        "Submit qs1_job_high (priority 3), qs1_job_med (2), qs1_job_low (1) to QS1",
        {
            "qs1_job_high": Expect("RUNNING", "runs in QS1's quota"),
            "qs1_job_med": Expect("RUNNING", "borrows QS2's idle instance"),
            "qs1_job_low": Expect("RUNNABLE", "QS3's idle instance is reserved"),
        },
        "qs1_job_low",
        submits=(("qs1_job_high", "QS1", 3), ("qs1_job_med", "QS1", 2), ("qs1_job_low", "QS1", 1)),
    ),
    Step(
        "Submit qs2_job_1 (priority 1) to QS2",
        {
            "qs2_job_1": Expect("RUNNING", "QS2 takes back the instance it lent"),
            "qs1_job_med": Expect("RUNNABLE", "cross-share reclaim", 1, "cross-share"),
            "qs1_job_high": Expect("RUNNING", "keeps running"),
            "qs1_job_low": Expect("RUNNABLE", "still waits"),
        },
        "qs1_job_med",
        submits=(("qs2_job_1", "QS2", 1),),
    ),
    Step(
        "UpdateServiceJob(qs1_job_low, schedulingPriority=4)",
        {
            "qs1_job_low": Expect("RUNNING", "highest priority in QS1 now"),
            "qs1_job_high": Expect("RUNNABLE", "in-share preemption", 1, "in-share"),
            "qs1_job_med": Expect("RUNNABLE", "stays queued", 1),
            "qs2_job_1": Expect("RUNNING", "keeps running"),
        },
        "qs1_job_high",
        updates=(("qs1_job_low", 4),),
    ),
)


def play_steps(play: Callable[[int], bool]) -> int:
    """Plays the steps (``play(index)``: it passed) in order until one fails; how many passed."""
    passed = 0
    while passed < len(STEPS) and play(passed):
        passed += 1
    return passed


def preempted_count(job: dict[str, Any]) -> int:
    return int(job.get("preemptionSummary", {}).get("preemptedAttemptCount", 0))


def preemption_kind(job: dict[str, Any]) -> str | None:
    reason = str(job.get("statusReason") or "")
    for kind in ("cross-share", "in-share"):
        if f"({kind})" in reason:
            return kind
    return None


def observed(job: dict[str, Any] | None) -> str:
    if job is None:
        return "-"
    out = str(job["status"])
    count = preempted_count(job)
    if count:
        kind = preemption_kind(job) if job["status"] == "RUNNABLE" else None
        out += f", preempted {count}x" + (f" ({kind})" if kind else "")
    return out
