"""``gpuquota demo``: the worked example of semantics.md S8, end to end, through boto3.

Without ``--endpoint`` it starts an embedded stack (``gpuquota up`` in a background thread: gateway,
scheduler and one local node agent offering 3 x ml.g5.xlarge) on a free port, with a fresh event log in
a temporary directory. The default runtime is ``process``: every job is a small real Python process
that "trains" (counts steps into its checkpoint directory) until it is stopped or 10 minutes pass; a
preempted job is stopped with SIGTERM and resumes from its checkpoint when it runs again.
``--runtime simulated`` runs no processes; ``--runtime container`` runs every job as a container of a
small image built locally (``gpuquota.ctl.demo_image``) with SageMaker's training contract. With
``--endpoint URL`` it drives that stack instead (its node agents decide the runtime; the job command
is ``python3``).

The demo applies the worked example's resources (the same as ``deploy/examples/worked-example.yaml``),
then plays the three steps. After each step it polls (with a deadline) until the expected outcome
holds, prints a table per quota share and the expected and observed job states with PASS/FAIL. At the
end it terminates its jobs (and waits until they are stopped), writes ``timeline.svg`` to the output
directory and exits 1 if a step failed.

The scenario itself (resources, job, steps and their expected states) is data in
``gpuquota.ctl.demo_scenario``; this module plays it and shows it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError
from gpuquota.ctl.apply import apply, format_changes
from gpuquota.ctl.apply_doc import parse
from gpuquota.ctl.commands import format_shares, guarded
from gpuquota.ctl.demo_image import RUNTIME_LINES, build_demo_image, container_payload
from gpuquota.ctl.demo_scenario import (
    DISPATCHED,
    G5,
    JOB_SECONDS,
    QUEUE,
    STEPS,
    TERMINAL,
    WORKED_EXAMPLE,
    Step,
    job_payload,
    observed,
    play_steps,
)
from gpuquota.ctl.render import Style
from gpuquota.ctl.timeline import Marker, Timeline, Track, render_svg, segments_from_samples

DEFAULT_OUTPUT_DIR = ".gpuquota/demo"
POLL_SECONDS = 0.1


# ----- the run -------------------------------------------------------------------------------------


class Stack(Protocol):
    """A stack the demo drives: the CLI starts an embedded one (``entrypoints.demo_stack``), so that
    this module, a client of the gateway, imports no server."""

    @property
    def url(self) -> str: ...

    def close(self) -> None: ...


StartStack = Callable[[Path, str], Stack]
"""(data directory, runtime) -> a running stack on a free port."""


@dataclass
class StepResult:
    step: Step
    ok: bool
    seconds: float
    jobs: dict[str, dict[str, Any]]


@dataclass
class Demo:
    api: Api
    python: str
    style: Style
    out: Callable[[str], None] = print
    step_timeout: float = 30.0
    image: str | None = None  # --runtime container: the jobs' TrainingImage
    ids: dict[str, str] = field(default_factory=dict)
    """job name -> job id, in submission order"""
    samples: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps_at: list[tuple[int, str]] = field(default_factory=list)
    started_ms: int = 0

    # ----- observation -------------------------------------------------------------------------

    def observe(self) -> dict[str, dict[str, Any]]:
        """Describe every demo job once; record status changes for the timeline (keyed by name)."""
        for name, job_id in self.ids.items():
            job = self.api.call("describe_service_job", jobId=job_id)
            now = _now_ms()
            self.latest[name] = job
            history = self.samples.setdefault(name, [])
            if not history or history[-1][1] != job["status"]:
                history.append((now, str(job["status"])))
        return dict(self.latest)

    def wait(self, condition: Callable[[dict[str, dict[str, Any]]], bool], timeout: float) -> bool:
        """Poll until ``condition`` holds for the observed jobs or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if condition(self.observe()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)

    # ----- actions -----------------------------------------------------------------------------

    def submit(self, name: str, share: str, priority: int) -> None:
        out = self.api.call(
            "submit_service_job",
            jobName=name,
            jobQueue=QUEUE,
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName=share,
            schedulingPriority=priority,
            serviceRequestPayload=(
                job_payload(self.python)
                if self.image is None
                else container_payload(self.image, G5, JOB_SECONDS)
            ),
        )
        self.ids[name] = str(out["jobId"])
        self.samples.setdefault(name, []).append((_now_ms(), "SUBMITTED"))

    def act(self, index: int) -> None:
        labels = ("1: submit 3 jobs to QS1", "2: submit qs2_job_1 to QS2", "3: qs1_job_low priority 1 -> 4")
        self.steps_at.append((_now_ms(), labels[index]))
        STEPS[index].act(self.submit, self.update)

    def update(self, name: str, priority: int) -> None:
        self.api.call("update_service_job", jobId=self.ids[name], schedulingPriority=priority)

    # ----- the whole demo ----------------------------------------------------------------------

    def setup(self) -> None:
        s = self.style
        self.out(s("Setup", "bold") + "  (the same as gpuquota apply -f deploy/examples/worked-example.yaml)")
        changes = apply(self.api, parse(WORKED_EXAMPLE, "the worked example"))
        self.out(_indent(format_changes(changes, s)))
        leftovers = [
            j
            for j in self.api.pages(
                "list_service_jobs",
                "jobSummaryList",
                jobQueue=QUEUE,
                filters=[{"name": "AFTER_CREATED_AT", "values": ["0"]}],
            )
            if j["status"] not in TERMINAL
        ]
        if leftovers:
            self.out(f"  terminating {len(leftovers)} job(s) left in {QUEUE} by an earlier run")
            ids = [j["jobId"] for j in leftovers]
            self.terminate(ids, "Terminated by gpuquota demo: left over from an earlier run")
        self.out("")

    def terminate(self, ids: list[str], reason: str) -> bool:
        for job_id in ids:
            self.api.call("terminate_service_job", jobId=job_id, reason=reason)
        deadline = time.monotonic() + 60
        while True:
            left = [
                i for i in ids if self.api.call("describe_service_job", jobId=i)["status"] not in TERMINAL
            ]
            if not left or time.monotonic() >= deadline:
                return not left
            time.sleep(POLL_SECONDS)

    def run_step(self, index: int) -> StepResult:
        step = STEPS[index]
        s = self.style
        self.out(s(f"Step {index + 1}", "bold", "blue") + "  " + s(step.title, "bold"))
        began = time.monotonic()
        self.act(index)
        ok = self.wait(
            lambda jobs: all(e.holds(jobs.get(n)) for n, e in step.expect.items()), self.step_timeout
        )
        seconds = time.monotonic() - began
        jobs = dict(self.latest)
        self.out(self.share_table(jobs))
        rows = []
        for name, expect in step.expect.items():
            good = expect.holds(jobs.get(name))
            rows.append(
                [
                    name,
                    expect.text(),
                    observed(jobs.get(name)),
                    s("ok", "green") if good else s("MISMATCH", "bold", "red"),
                    s(expect.note, "dim"),
                ]
            )
        self.out("")
        self.out(render.table(["JOB", "EXPECTED", "OBSERVED", "CHECK", "WHY"], rows, indent="  "))
        self.out(self.explain_line(step.explain))
        verdict = f"reached in {seconds:.2f} s" if ok else f"not reached within {self.step_timeout:g} s"
        self.out(f"  {s.verdict(ok)}  step {index + 1}: {verdict}")
        self.out("")
        return StepResult(step, ok, seconds, jobs)

    def share_table(self, jobs: dict[str, dict[str, Any]]) -> str:
        rows = self.api.shares(QUEUE)
        by_share: dict[str, list[str]] = {}
        for name, job in jobs.items():
            short = name.removeprefix("qs1_job_") if name.startswith("qs1_job_") else name
            by_share.setdefault(str(job.get("quotaShareName")), []).append(
                f"{short} {self.style.status(str(job['status']))}"
            )
        return format_shares(rows, self.style, jobs={k: ", ".join(v) for k, v in by_share.items()})

    def explain_line(self, name: str) -> str:
        data = self.api.explain(self.ids[name])
        explanation = data.get("explanation") or {}
        lead = f"  {self.style('gpuquota explain', 'dim')} {name}:"
        text = f"{lead} " + (
            f"{explanation['reason']}: {explanation['message']}" if explanation else str(data["status"])
        )
        last = data.get("lastPreemption")
        if last:
            pad = " " * render.visible_len(lead)
            text += f"\n{pad} last preemption: {last['statusReason']}"
        return self.replace_ids(text)

    def replace_ids(self, text: str) -> str:
        for name, job_id in self.ids.items():
            text = text.replace(job_id, name)
        return text

    def timeline(self, end: int, subtitle: str) -> Timeline:
        """The picture of the run: the gateway's exact status history of every job (polled samples
        when it has none), its preemption decisions and when the victims stopped."""
        timeline = Timeline(
            "gpuquota demo: the worked example (semantics.md S8)",
            subtitle,
            self.started_ms,
            end,
            steps=list(self.steps_at),
        )
        for name, job_id in self.ids.items():
            job = self.latest.get(name) or self.api.call("describe_service_job", jobId=job_id)
            data = self.api.explain(job_id)
            history = [(int(h["at"]), str(h["status"])) for h in data.get("history", [])]
            samples = [(t, st) for t, st in history if t <= end] or self.samples.get(name, [])
            track = Track(
                name,
                f"{job.get('quotaShareName')} · priority {self._priorities(name, job)}",
                segments_from_samples(samples, end),
            )
            for p in reversed(data.get("preemptions", [])):
                decided = int(p["decidedAt"])
                stopped = next((t for t, st in history if t > decided and st not in DISPATCHED), None)
                by = p.get("preemptorJobName") or p["preemptorJobId"]
                track.markers.append(Marker(decided, p["kind"], f"for {by}", stopped))
            timeline.tracks.append(track)
        return timeline

    def _priorities(self, name: str, job: dict[str, Any]) -> str:
        now = int(job.get("schedulingPriority", 0))
        first = {"qs1_job_high": 3, "qs1_job_med": 2, "qs1_job_low": 1, "qs2_job_1": 1}.get(name, now)
        return str(now) if first == now else f"{first} -> {now}"


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# ----- the command ---------------------------------------------------------------------------------


def configure_demo(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    endpoint_help = "drive a running stack at URL (default: start an embedded one)"
    add("--endpoint", default=argparse.SUPPRESS, help=endpoint_help)  # kept if given before `demo`
    add(
        "--output-dir",
        default=DEFAULT_OUTPUT_DIR,
        help=f"where timeline.svg goes (default ./{DEFAULT_OUTPUT_DIR})",
    )
    add(
        "--runtime",
        choices=("process", "simulated", "container"),
        default="process",
        help="embedded stack only: jobs as real local processes (default), containers or simulated",
    )
    add("--step-timeout", type=float, default=30.0, help="seconds each step may take (default 30)")
    add(
        "--sdk",
        action="store_true",
        help="the seed blog's steps with the SageMaker SDK itself (SourceCode, S3, containers; the sdk "
        "extra, podman or docker, a gpuquota checkout): gpuquota up --runtime container --s3 local",
    )


def run_demo(args: argparse.Namespace, start_stack: StartStack) -> int:
    if args.sdk:
        from gpuquota.ctl.demo_sdk import run_sdk_demo

        return run_sdk_demo(args)
    held = _Held()
    try:
        return guarded("gpuquota demo", lambda: _play(args, start_stack, held))
    finally:
        held.clean_up()


@dataclass
class _Held:
    """What the demo started, for ``clean_up`` to stop and remove however the demo ended."""

    demo: Demo | None = None
    api: Api | None = None
    stack: Stack | None = None
    temp: tempfile.TemporaryDirectory[str] | None = None

    def clean_up(self) -> None:
        """Terminate the demo's jobs and wait until they are stopped (no process outlives the demo)."""
        try:
            reason = "Terminated by gpuquota demo: the demo is over"
            demo = self.demo
            if demo is not None and demo.ids and not demo.terminate(list(demo.ids.values()), reason):
                print("gpuquota demo: some jobs did not stop within 60 s", file=sys.stderr)
        except CliError as exc:
            print(f"gpuquota demo: cleaning up: {exc}", file=sys.stderr)
        finally:
            if self.api is not None:
                self.api.close()
            if self.stack is not None:
                self.stack.close()
            if self.temp is not None:
                self.temp.cleanup()


def _play(args: argparse.Namespace, start_stack: StartStack, held: _Held) -> int:
    style = Style.for_stream(sys.stdout)
    out_dir = Path(args.output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    print(style("gpuquota demo", "bold") + ": the worked example of semantics.md S8, through boto3")
    image: str | None = None
    if args.endpoint:
        endpoint, python = args.endpoint, "python3"
        where = f"{endpoint} (its node agents decide the runtime)"
    else:
        logging.getLogger("gpuquota").setLevel(logging.WARNING)
        held.temp = temp = tempfile.TemporaryDirectory(prefix="gpuquota-demo-")
        image = build_demo_image() if args.runtime == "container" else None
        try:
            held.stack = stack = start_stack(Path(temp.name), args.runtime)
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot start the embedded stack: {exc}") from None
        endpoint, python = stack.url, sys.executable
        runtime = RUNTIME_LINES[args.runtime]
        where = f"embedded stack at {endpoint}, 1 node agent with 3 x {G5}\n         {runtime}"
    print(f"  stack  {where}")
    print("")
    held.api = api = Api(endpoint)
    api.get("/health")
    held.demo = demo = Demo(api, python, style, step_timeout=args.step_timeout, image=image)
    demo.started_ms = _now_ms()
    demo.setup()
    demo.started_ms = _now_ms()
    passed = play_steps(lambda index: demo.run_step(index).ok)
    failed = passed < len(STEPS)
    end = _now_ms()
    subtitle = f"SE 3 x {G5} · QS1 LEND_AND_BORROW 200%, in-share preemption · QS2 LEND · QS3 RESERVE · " + (
        f"stack at {endpoint}" if args.endpoint else f"embedded stack, {args.runtime} runtime"
    )
    svg = render_svg(demo.timeline(end, subtitle))
    path = out_dir / "timeline.svg"
    path.write_text(svg)
    print(style.verdict(not failed) + f"  {passed}/{len(STEPS)} steps passed")
    print(f"Timeline: {path}")
    return 1 if failed else 0
