"""``gpuquota demo --sdk``: the seed blog's three steps played by the SageMaker Python SDK itself.

Theory of operation
-------------------
Where ``gpuquota demo`` submits hand-made payloads through boto3, this one runs what the blog runs: a
``ModelTrainer`` with ``SourceCode(command="echo 'Hello World'")`` and the SDK's PyTorch image,
submitted with ``TrainingQueue.submit``, reprioritised with ``TrainingQueuedJob.update``. So that the
SDK's code path is the real one, the demo starts a real ``gpuquota up --runtime container --s3 local``
(a child process, on a free port, with a temporary data directory): S3Proxy for the SDK's uploads and
the jobs' ``model.tar.gz``, podman (or docker) for the jobs, and ``GPUQUOTA_IMAGE_MAP`` sending the
blog's ECR image to the local SDK image (``gpuquota.ctl.sdk_image``). The SDK and boto3 are set up as
``eval "$(gpuquota env)"`` would (``gpuquota.ctl.env``), in this process's environment.

It checks what it needs first and says what is missing: the ``sdk`` extra, a container engine, the
checkout's ``deploy/local`` scripts (S3Proxy, the image). Each step waits (with a deadline) for the
states of ``gpuquota.ctl.demo_scenario.STEPS``; then every job must succeed, and the demo shows the
``Hello World`` of each job's log and where its model is in S3. Exit status 1 when anything fails.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuquota.ctl import render
from gpuquota.ctl.api import Api, CliError
from gpuquota.ctl.apply import apply
from gpuquota.ctl.apply_doc import parse
from gpuquota.ctl.commands import guarded
from gpuquota.ctl.demo_scenario import G5, QUEUE, STEPS, TERMINAL, WORKED_EXAMPLE, Step, observed, play_steps
from gpuquota.ctl.env import env_lines
from gpuquota.ctl.render import Style
from gpuquota.ctl.sdk_image import build_sdk_image, image_map

START_SECONDS = 30
"""The SDK image's start (``sdk_image``): long enough for the three steps to find its jobs running."""
GRACE = "3"
"""``gpuquota up --preemption-grace``: the image's bash ignores SIGTERM, so a stop waits all of it."""
FINISH_SECONDS = 240.0
POLL = 0.25


def _require_sdk() -> None:
    try:
        import sagemaker.train.aws_batch.training_queue  # noqa: F401
    except ImportError:
        raise CliError(
            "--sdk needs the SageMaker SDK: pip install 'gpuquota[sdk]' (sagemaker-train)"
        ) from None


def _engine() -> str:
    from gpuquota.node_agent.container import ContainerEngine, EngineMissing

    try:
        return ContainerEngine.find().path
    except EngineMissing as exc:
        raise CliError(f"--sdk runs its jobs in containers: {exc}") from None


@contextlib.contextmanager
def local_stack(data_dir: Path, images: str) -> Iterator[str]:
    """``gpuquota up --runtime container --s3 local`` in a child process; yields its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQUOTA_")}
    env |= {"GPUQUOTA_PORT": "0", "GPUQUOTA_IMAGE_MAP": images, "GPUQUOTA_LOG_LEVEL": "WARNING"}
    argv = [sys.executable, "-m", "gpuquota", "up", "--data-dir", str(data_dir), "--runtime", "container"]
    argv += ["--s3", "local", "--nodes", f"{G5}=3", "--preemption-grace", GRACE]
    log = open(data_dir.parent / "up.log", "w+")  # noqa: SIM115 (read back when it fails)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # "s3 ready on ...", then "gpuquota ready on URL"
            if line.startswith("gpuquota ready on "):
                break
        else:
            log.seek(0)
            raise CliError("gpuquota up --s3 local --runtime container failed:\n" + log.read()[-2000:])
        yield line.strip().rsplit(" ", 1)[1]
    finally:
        proc.terminate()  # stops its jobs' containers and S3Proxy
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(90)
        if proc.poll() is None:
            proc.kill()
        log.close()


def set_environment(api: Api, config_dir: Path) -> None:
    """What ``eval "$(gpuquota env)"`` does, in this process (before the SDK makes a client)."""
    for line in env_lines(api.endpoint, api.get("/gpuquota/v1/env"), os.environ, config_dir, None):
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            os.environ[name] = shlex.split(value)[0] if value else ""
        elif line.startswith("unset "):
            for name in line.split()[1:]:
                os.environ.pop(name, None)


class BlogRun:
    """The blog's trainer and queue; its jobs by name."""

    def __init__(self) -> None:
        from sagemaker.core import image_uris
        from sagemaker.core.helper.session_helper import Session
        from sagemaker.train.aws_batch.training_queue import TrainingQueue
        from sagemaker.train.configs import Compute, SourceCode, StoppingCondition
        from sagemaker.train.model_trainer import ModelTrainer

        self.session = Session()
        self.image_uri = image_uris.retrieve(
            framework="pytorch",
            region=self.session.boto_session.region_name,
            version="2.5",
            instance_type=G5,
            image_scope="training",
        )
        self.trainer = ModelTrainer(
            training_image=self.image_uri,
            source_code=SourceCode(command="echo 'Hello World'"),
            base_job_name="hello-world-simple-job",
            compute=Compute(instance_type=G5, instance_count=1),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=300),
        )
        self.queue = TrainingQueue(QUEUE)
        self.jobs: dict[str, Any] = {}

    def submit(self, name: str, share: str, priority: int) -> None:
        self.jobs[name] = self.queue.submit(
            job_name=name, training_job=self.trainer, quota_share_name=share, priority=priority, inputs=None
        )

    def act(self, index: int) -> None:
        STEPS[index].act(self.submit, self.update)

    def update(self, name: str, priority: int) -> None:
        self.jobs[name].update(scheduling_priority=priority)

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: job.describe() for name, job in self.jobs.items()}


def wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def play_step(run: BlogRun, index: int, style: Style, timeout: float) -> bool:
    step: Step = STEPS[index]
    print(style(f"Step {index + 1}", "bold", "blue") + "  " + style(step.title, "bold"))
    began = time.monotonic()
    run.act(index)
    seen: dict[str, dict[str, Any]] = {}

    def reached() -> bool:
        seen.update(run.describe())
        return all(e.holds(seen.get(n)) for n, e in step.expect.items())

    ok = wait(reached, timeout)
    rows = [
        [
            name,
            e.text(),
            observed(seen.get(name)),
            style("ok", "green") if e.holds(seen.get(name)) else "MISMATCH",
        ]
        for name, e in step.expect.items()
    ]
    print(render.table(["JOB", "EXPECTED", "OBSERVED", "CHECK"], rows, indent="  "))
    took = f"reached in {time.monotonic() - began:.1f} s" if ok else f"not reached within {timeout:g} s"
    print(f"  {style.verdict(ok)}  step {index + 1}: {took}\n")
    return ok


def job_log(api: Api, job_id: str) -> str:
    text, offset = "", 0
    while True:
        chunk = api.logs(job_id, None, offset)
        text += chunk["text"]
        if chunk["complete"] or int(chunk["nextOffset"]) == offset:
            return text
        offset = int(chunk["nextOffset"])


def model_location(s3: Any, payload: dict[str, Any]) -> tuple[str, int | None]:
    """``<S3OutputPath>/<TrainingJobName>/output/model.tar.gz`` and its size (None: not there)."""
    bucket, _, prefix = payload["OutputDataConfig"]["S3OutputPath"].removeprefix("s3://").partition("/")
    key = "/".join(p for p in (prefix.strip("/"), payload["TrainingJobName"], "output/model.tar.gz") if p)
    try:
        return f"s3://{bucket}/{key}", int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception:  # botocore's ClientError (404) or any S3 failure: shown as missing
        return f"s3://{bucket}/{key}", None


def show_results(run: BlogRun, api: Api, style: Style) -> bool:
    import json

    import boto3

    print(style("Jobs", "bold") + f"  (until all four end, at most {FINISH_SECONDS:g} s)")
    final: dict[str, dict[str, Any]] = {}

    def ended() -> bool:
        final.update(run.describe())
        return all(j["status"] in TERMINAL for j in final.values())

    wait(ended, FINISH_SECONDS)
    s3, good, rows = boto3.client("s3"), True, []
    for name, job in final.items():
        hello = "Hello World" in job_log(api, job["jobId"]).splitlines()
        where, size = model_location(s3, json.loads(job["serviceRequestPayload"]))
        ok = job["status"] == "SUCCEEDED" and hello and size is not None
        good &= ok
        log_cell = "Hello World" if hello else "(no Hello World)"
        model_cell = f"{where} ({size} bytes)" if size is not None else f"{where} (missing)"
        rows.append([name, style.status(str(job["status"])), log_cell, model_cell, style.verdict(ok)])
    print(render.table(["JOB", "STATUS", "LOG", "MODEL", "CHECK"], rows, indent="  "))
    print("")
    return good


def run_sdk_demo(args: argparse.Namespace) -> int:
    return guarded("gpuquota demo --sdk", lambda: _said(args))


def _said(args: argparse.Namespace) -> int:
    try:
        return _play(args)
    except CliError:
        raise
    except Exception as exc:  # the SDK's and botocore's own errors: said, not a traceback
        print(f"gpuquota demo --sdk: the SDK failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _play(args: argparse.Namespace) -> int:
    style = Style.for_stream(sys.stdout)
    _require_sdk()
    if getattr(args, "endpoint", None):
        raise CliError(
            "--sdk starts its own stack (gpuquota up --s3 local --runtime container): drop --endpoint"
        )
    engine = _engine()
    print(style("gpuquota demo --sdk", "bold") + ": the seed blog's three steps with the SageMaker SDK")
    image = build_sdk_image(engine, START_SECONDS)
    for name in ("botocore", "sagemaker"):  # their INFO lines would drown the demo's
        logging.getLogger(name).setLevel(logging.WARNING)
    with (
        tempfile.TemporaryDirectory(prefix="gpuquota-demo-sdk-") as tmp,
        local_stack(Path(tmp) / "up", image_map(image)) as url,
    ):
        api = Api(url)
        set_environment(api, Path(tmp) / "config")
        print(f"  stack  gpuquota up --runtime container --s3 local at {url}, 3 x {G5}")
        apply(api, parse(WORKED_EXAMPLE, "the worked example"))
        run = BlogRun()
        print(f"  image  {run.image_uri} -> {image} (GPUQUOTA_IMAGE_MAP)\n")
        passed = play_steps(lambda index: play_step(run, index, style, args.step_timeout))
        jobs_ok = passed == len(STEPS) and show_results(run, api, style)
        api.close()
    ok = passed == len(STEPS) and jobs_ok
    summary = f"{passed}/{len(STEPS)} steps passed" + (", every job said Hello World" if jobs_ok else "")
    print(style.verdict(ok) + "  " + summary + (" and left its model.tar.gz in S3" if jobs_ok else ""))
    return 0 if ok else 1
