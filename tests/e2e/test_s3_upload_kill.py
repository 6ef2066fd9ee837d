"""A node agent SIGKILLed while it uploads an attempt's model: the next ``gpuquota up`` on the same data
directory adopts the ended attempt and uploads what is missing; the model is in S3 once, whole, and
the job SUCCEEDED (real ``gpuquota up`` processes, a real S3Proxy)."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import boto3

from tests.e2e.conftest import batch_client, poll
from tests.gateway.helpers import create_queue, create_share, submit
from tests.node_agent.conftest import python_payload

MODEL_MB = 96
TRAINER = f"""
import hashlib, os, pathlib
path = pathlib.Path(os.environ["SM_MODEL_DIR"], "model.bin")
digest = hashlib.sha256()
with open(path, "wb") as out:
    for _ in range({MODEL_MB}):
        chunk = os.urandom(1024 * 1024)
        digest.update(chunk)
        out.write(chunk)
pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"], "sha256").write_text(digest.hexdigest())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def up(data_dir: Path, port: int, s3: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **s3, "GPUQUOTA_LOG_LEVEL": "INFO"}
    endpoint = env.pop("GPUQUOTA_S3_ENDPOINT_URL")
    cmd = [sys.executable, "-m", "gpuquota", "up", "--data-dir", str(data_dir), "--port", str(port)]
    cmd += ["--nodes", "ml.g5.xlarge=1", "--s3", endpoint]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def status(batch: Any, job_id: str) -> str:
    return str(batch.describe_service_job(jobId=job_id)["status"])


def test_agent_killed_during_the_model_upload_uploads_it_once(
    s3_server: dict[str, str], tmp_path: Path
) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=s3_server["GPUQUOTA_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=s3_server["GPUQUOTA_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_server["GPUQUOTA_S3_SECRET_ACCESS_KEY"],
    )
    bucket = f"kill-{os.getpid()}-{free_port()}"
    client.create_bucket(Bucket=bucket)
    port, data = free_port(), tmp_path / "stack"
    first_log, second_log = tmp_path / "up-1.log", tmp_path / "up-2.log"
    first = up(data, port, s3_server, first_log)
    second: subprocess.Popen[bytes] | None = None
    try:
        batch = batch_client(f"http://127.0.0.1:{port}")
        poll(lambda: first_log.exists() and b"gpuquota ready" in first_log.read_bytes(), 60, "gpuquota up")
        create_queue(batch, capacity=1)
        create_share(batch, "QS1")
        body = python_payload(
            TRAINER, TrainingJobName="big-model", OutputDataConfig={"S3OutputPath": f"s3://{bucket}/out"}
        )
        job = submit(batch, "big", "QS1", serviceRequestPayload=body)
        poll(lambda: b"uploading model.tar.gz" in first_log.read_bytes(), 120, "the model upload to begin")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        assert b"uploaded model.tar.gz" not in first_log.read_bytes(), "the upload ended before the kill"

        second = up(data, port, s3_server, second_log)
        poll(lambda: second_log.exists() and b"gpuquota ready" in second_log.read_bytes(), 60, "restart")
        poll(lambda: status(batch, job) in ("SUCCEEDED", "FAILED"), 120, "the job to end")
        described = batch.describe_service_job(jobId=job)
        assert described["status"] == "SUCCEEDED", described.get("statusReason")
        assert len(described["attempts"]) == 1  # the attempt was adopted, not run again
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)
    listed = client.list_objects_v2(Bucket=bucket, Prefix="out/big-model/output/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [
        "out/big-model/output/model.tar.gz",
        "out/big-model/output/output.tar.gz",
    ]
    expected = _tar(client, bucket, "out/big-model/output/output.tar.gz")["sha256"].decode()
    model = _tar(client, bucket, "out/big-model/output/model.tar.gz")["model.bin"]
    assert len(model) == MODEL_MB * 1024 * 1024
    assert hashlib.sha256(model).hexdigest() == expected
    assert second_log.read_bytes().count(b"uploaded model.tar.gz") == 1


def _tar(client: Any, bucket: str, key: str) -> dict[str, bytes]:
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
