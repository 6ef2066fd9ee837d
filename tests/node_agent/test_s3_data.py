"""The SageMaker contract's S3 half against a real S3-compatible server (S3Proxy, ``deploy/local/s3.sh``):
channels downloaded before the launch, model.tar.gz and output.tar.gz where SageMaker puts them,
checkpoints restored on another node after a preemption, clear reasons for missing data."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from gpuquota.config.s3 import S3Settings
from gpuquota.entrypoints.metrics_port import agent_families
from gpuquota.node_agent import NodeAgent, ProcessRuntime, parse_slots
from gpuquota.node_agent.s3_stage import data_plane
from tests.node_agent.conftest import Scheduler, python_payload, run_cmd, stop_cmd, wait_final, wait_until

TRAINER = """
import json, os, pathlib, signal, sys, time
channel = pathlib.Path(os.environ["SM_CHANNEL_TRAIN"])
names = sorted(p.relative_to(channel).as_posix() for p in channel.rglob("*") if p.is_file())
text = "".join((channel / n).read_text() for n in names)
ckpt = pathlib.Path(os.environ["SM_CHECKPOINT_DIR"]) / "step"
start = int(ckpt.read_text()) if ckpt.exists() else 0
pathlib.Path(os.environ["SM_MODEL_DIR"], "model.json").write_text(
    json.dumps({"names": names, "text": text, "resumed_from": start}))
pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"], "metrics.txt").write_text("loss=0.1")
steps = int(os.environ.get("STEPS", "0"))
stopped = False
def term(*_):
    global stopped
    stopped = True
signal.signal(signal.SIGTERM, term)
step = start
while step < start + steps and not stopped:
    step += 1
    ckpt.write_text(str(step))
    time.sleep(0.05)
ckpt.write_text(str(step))
sys.exit(0)
"""


def s3_client(env: dict[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=env["GPUQUOTA_S3_ENDPOINT_URL"],
        region_name=env["GPUQUOTA_S3_REGION"],
        aws_access_key_id=env["GPUQUOTA_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=env["GPUQUOTA_S3_SECRET_ACCESS_KEY"],
    )


@pytest.fixture
def bucket(s3_server: dict[str, str]) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_client(s3_server).create_bucket(Bucket=name)
    return name


def agent(sched: Scheduler, work: Path, s3: dict[str, str], node: str = "node-1", **extra: str) -> NodeAgent:
    settings = S3Settings.s3_from_env({**s3, **extra})
    return NodeAgent(
        node,
        "default",
        parse_slots("ml.g5.xlarge=1"),
        ProcessRuntime(poll_seconds=0.01),
        sched.send,
        work,
        heartbeat_seconds=60,
        preemption_grace=5,
        retry_seconds=0.01,
        data=data_plane(settings),
    )


def payload(bucket: str, channels: list[dict[str, Any]], **extra: Any) -> str:
    return python_payload(
        TRAINER,
        TrainingJobName="s3-job",
        InputDataConfig=channels,
        OutputDataConfig={"S3OutputPath": f"s3://{bucket}/out"},
        **extra,
    )


def channel(name: str, uri: str, data_type: str = "S3Prefix", mode: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3Uri": uri, "S3DataType": data_type}},
    }
    if mode:
        doc["InputMode"] = mode
    return doc


def members(client: Any, bucket: str, key: str) -> dict[str, bytes]:
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


async def test_an_s3_channel_is_read_and_the_model_lands_where_sagemaker_puts_it(
    s3_server: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    client = s3_client(s3_server)
    client.put_object(Bucket=bucket, Key="data/train/a.txt", Body=b"alpha ")
    client.put_object(Bucket=bucket, Key="data/train/sub/b.txt", Body=b"beta")
    sched = Scheduler()
    node = agent(sched, tmp_path / "work", s3_server)
    await node.start()
    try:
        await node.deliver(run_cmd(payload(bucket, [channel("train", f"s3://{bucket}/data/train/")])))
        report = await wait_final(sched, "job-1-a1", 60)
    finally:
        await node.stop()
    assert report.status == "SUCCEEDED", report.status_reason
    model = members(client, bucket, "out/s3-job/output/model.tar.gz")
    assert json.loads(model["model.json"]) == {
        "names": ["a.txt", "sub/b.txt"],
        "text": "alpha beta",
        "resumed_from": 0,
    }
    assert members(client, bucket, "out/s3-job/output/output.tar.gz") == {"metrics.txt": b"loss=0.1"}
    metrics = {  # the agent's /metrics families: bytes and seconds of its transfers, per direction
        (family.name, sample.labels["direction"]): sample.value
        for family in agent_families(SimpleNamespace(agent=node))
        if family.name.startswith("gpuquota_agent_transfer")
        for sample in family.samples
    }
    assert metrics[("gpuquota_agent_transfer_bytes", "download")] == len(b"alpha beta")
    assert metrics[("gpuquota_agent_transfer_bytes", "upload")] > 0
    assert metrics[("gpuquota_agent_transfer_seconds", "upload")] > 0


async def test_a_manifest_channel_in_fastfile_mode_is_served_as_file(
    s3_server: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    client = s3_client(s3_server)
    client.put_object(Bucket=bucket, Key="raw/x.txt", Body=b"x")
    client.put_object(Bucket=bucket, Key="raw/y.txt", Body=b"not listed")
    manifest = json.dumps([{"prefix": f"s3://{bucket}/raw/"}, "x.txt"]).encode()
    client.put_object(Bucket=bucket, Key="manifest.json", Body=manifest)
    sched = Scheduler()
    node = agent(sched, tmp_path / "work", s3_server)
    await node.start()
    try:
        uri = f"s3://{bucket}/manifest.json"
        await node.deliver(run_cmd(payload(bucket, [channel("train", uri, "ManifestFile", "FastFile")])))
        report = await wait_final(sched, "job-1-a1", 60)
    finally:
        await node.stop()
    assert report.status == "SUCCEEDED", report.status_reason
    model = json.loads(members(client, bucket, "out/s3-job/output/model.tar.gz")["model.json"])
    assert model["names"] == ["x.txt"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            lambda b: channel("train", f"s3://{b}/nothing-here/"),
            'ClientError: No S3 objects found under S3 URL "s3://{b}/nothing-here/" given in input data',
        ),
        (
            lambda b: channel("train", f"s3://{b}/missing-manifest.json", "ManifestFile"),
            "ClientError: Data download failed:Could not download s3://{b}/missing-manifest.json: NoSuchKey",
        ),
        (
            lambda b: channel("train", f"s3://{b}/data/", mode="Pipe"),
            "ClientError: Channel train: TrainingInputMode Pipe is not supported",
        ),
    ],
)
async def test_missing_data_fails_the_attempt_with_a_clear_reason(
    s3_server: dict[str, str], bucket: str, tmp_path: Path, source: Any, expected: str
) -> None:
    s3_client(s3_server).put_object(Bucket=bucket, Key="data/a", Body=b"a")
    sched = Scheduler()
    node = agent(sched, tmp_path / "work", s3_server)
    await node.start()
    try:
        await node.deliver(run_cmd(payload(bucket, [source(bucket)])))
        report = await wait_final(sched, "job-1-a1", 60)
    finally:
        await node.stop()
    assert report.status == "FAILED"
    assert report.status_reason is not None
    assert report.status_reason.startswith("Received status from SageMaker: ")
    assert expected.format(b=bucket) in report.status_reason
    assert sched.statuses("job-1-a1") == ["STARTING", "FAILED"]  # never launched


async def test_a_preempted_job_resumes_on_another_node_from_its_s3_checkpoint(
    s3_server: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    client = s3_client(s3_server)
    client.put_object(Bucket=bucket, Key="data/train/a.txt", Body=b"a")
    checkpoint = {"S3Uri": f"s3://{bucket}/ckpt/s3-job"}
    body = payload(
        bucket,
        [channel("train", f"s3://{bucket}/data/train/")],
        CheckpointConfig=checkpoint,
        Environment={"STEPS": "100000"},
    )
    first_sched, second_sched = Scheduler(), Scheduler()
    first = agent(first_sched, tmp_path / "a", s3_server, "node-1", GPUQUOTA_S3_CHECKPOINT_SECONDS="0.2")
    await first.start()
    try:
        await first.deliver(run_cmd(body, node_id="node-1"))
        await wait_until(lambda: "RUNNING" in first_sched.statuses("job-1-a1"), 60, "attempt 1 running")

        def uploaded_step() -> int:
            listed = client.list_objects_v2(Bucket=bucket, Prefix="ckpt/s3-job/step").get("KeyCount", 0)
            if not listed:
                return 0
            return int(client.get_object(Bucket=bucket, Key="ckpt/s3-job/step")["Body"].read())

        await wait_until(lambda: uploaded_step() > 3, 60, "a checkpoint uploaded while it runs")
        await first.deliver(stop_cmd("job-1", "job-1-a1"))
        stopped = await wait_final(first_sched, "job-1-a1", 60)
    finally:
        await first.stop()
    assert stopped.status == "STOPPED", stopped.status_reason
    local_first = tmp_path / "a" / "checkpoints" / "job-1" / "step"
    at_term = int(local_first.read_text())
    assert uploaded_step() == at_term  # uploaded after SIGTERM, the last step included

    second_dir = tmp_path / "b"
    assert not (second_dir / "checkpoints").exists()  # nothing on node-2: it must come from S3
    second = agent(second_sched, second_dir, s3_server, "node-2")
    await second.start()
    try:
        resumed = run_cmd(body.replace('"100000"', '"3"'), node_id="node-2", attempt_number=2)
        await second.deliver(resumed)
        report = await wait_final(second_sched, "job-1-a2", 60)
    finally:
        await second.stop()
    assert report.status == "SUCCEEDED", report.status_reason
    model = json.loads(members(client, bucket, "out/s3-job/output/model.tar.gz")["model.json"])
    assert model["resumed_from"] == at_term
    assert uploaded_step() == at_term + 3
