"""SageMaker's contract without an engine: payload fields, channel paths, config files, variables,
engine flags and limits (the container runs are in test_container_runtime.py)."""

from __future__ import annotations

import json
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuquota.config.settings import NodeAgentSettings
from gpuquota.node_agent import LaunchError, LaunchSpec, make_runtime, parse_payload
from gpuquota.node_agent.container import ContainerEngine, ContainerRuntime, ulimit_flags
from gpuquota.node_agent.instances import instance_env, local_instances
from gpuquota.node_agent.payload import BadPayload
from gpuquota.node_agent.sagemaker_contract import channel_source, prepare_instance


def spec_for(tmp_path: Path, doc: Mapping[str, object], gpus: tuple[tuple[int, ...], ...] = ()) -> LaunchSpec:
    checkpoint = tmp_path / "checkpoints" / "job"
    checkpoint.mkdir(parents=True)
    return LaunchSpec(
        job_id="job",
        attempt_id="job-a1",
        request=parse_payload(json.dumps(doc)),
        env={"SM_CHECKPOINT_DIR": str(checkpoint), "CUDA_VISIBLE_DEVICES": "3", "GPUQUOTA_NODE_ID": "n1"},
        log_path=tmp_path / "logs" / "job-a1.log",
        cwd=tmp_path,
        instance_gpus=gpus,
    )


def channel(name: str, uri: str) -> dict[str, object]:
    return {"ChannelName": name, "DataSource": {"S3DataSource": {"S3Uri": uri}}, "ContentType": "text/csv"}


def test_payload_reads_the_image_and_the_channels() -> None:
    request = parse_payload(
        json.dumps(
            {
                "AlgorithmSpecification": {"TrainingImage": "localhost/t:1"},
                "InputDataConfig": [channel("train", "file:///data"), channel("eval", "/eval")],
            }
        )
    )
    assert request.training_image == "localhost/t:1"
    assert [(c.name, c.uri, c.settings) for c in request.channels] == [
        ("train", "file:///data", {"ContentType": "text/csv"}),
        ("eval", "/eval", {"ContentType": "text/csv"}),
    ]
    bad: dict[str, Any]
    for bad in (
        {"InputDataConfig": {}},
        {"InputDataConfig": [{"ChannelName": "x"}]},
        {"InputDataConfig": [channel("a b", "/x")]},
        {"InputDataConfig": [channel("a", "/x"), channel("a", "/y")]},
        {"AlgorithmSpecification": {"TrainingImage": 3}},
    ):
        with pytest.raises(BadPayload, match="Invalid serviceRequestPayload"):
            parse_payload(json.dumps(bad))


def test_channels_are_file_uris_or_absolute_paths_on_the_node(tmp_path: Path) -> None:
    request = parse_payload(
        json.dumps({"InputDataConfig": [channel("a", f"file://{tmp_path}"), channel("b", str(tmp_path))]})
    )
    assert [channel_source(c) for c in request.channels] == [tmp_path, tmp_path]
    for uri, why in (
        ("s3://bucket/key", "is not on this node"),
        ("relative/path", "is not on this node"),
        (f"file://{tmp_path}/missing", "does not exist on this node"),
    ):
        (bad,) = parse_payload(json.dumps({"InputDataConfig": [channel("c", uri)]})).channels
        with pytest.raises(LaunchError, match=why):
            channel_source(bad)


def test_config_files_mounts_and_variables_of_an_instance(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    doc = {
        "HyperParameters": {"lr": "0.1"},
        "InputDataConfig": [channel("train", f"file://{data}")],
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2},
        "CheckpointConfig": {"LocalPath": "/ckpt"},
    }
    spec = spec_for(tmp_path, doc, gpus=((0,), (1,)))
    second = local_instances(spec)[1]
    layout = prepare_instance(spec, second, instance_env(spec, second, "algo-1", 29500))
    config = layout.root / "input" / "config"
    assert layout.root == tmp_path / "attempts" / "job-a1" / "algo-2"
    assert json.loads((config / "hyperparameters.json").read_text()) == {"lr": "0.1"}
    resources = json.loads((config / "resourceconfig.json").read_text())
    assert (resources["current_host"], resources["hosts"]) == ("algo-2", ["algo-1", "algo-2"])
    assert json.loads((config / "inputdataconfig.json").read_text())["train"]["TrainingInputMode"] == "File"
    targets = {m.target: (m.source, m.read_only) for m in layout.mounts}
    assert targets["/opt/ml/input/data/train"] == (data, True)
    assert targets["/ckpt"] == (tmp_path / "checkpoints" / "job", False)
    assert targets["/opt/ml/model"] == (layout.root / "model", False)
    env = layout.env
    assert (env["SM_CURRENT_HOST"], env["NODE_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == (
        "algo-2",
        "1",
        "2",
        "algo-1",
    )
    assert (env["SM_CHECKPOINT_DIR"], env["SM_CHANNEL_TRAIN"], env["SM_NUM_GPUS"]) == (
        "/ckpt",
        "/opt/ml/input/data/train",
        "1",
    )
    assert "CUDA_VISIBLE_DEVICES" not in env, "GPUs are renumbered from 0 inside a container"


def test_engine_flags_and_limits() -> None:
    podman, docker = ContainerEngine("podman", "/usr/bin/podman", "runc"), ContainerEngine("docker", "docker")
    assert podman.gpu_flags((2, 3)) == ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"]
    assert docker.gpu_flags((2, 3)) == ["--gpus", "device=2,3"]
    assert podman.gpu_flags(()) == docker.gpu_flags(()) == []
    assert podman.argv("ps")[:3] == ["/usr/bin/podman", "--runtime", "runc"] and docker.argv("ps") == [
        "docker",
        "ps",
    ]
    flags = ulimit_flags()
    assert flags[0::2] == ["--ulimit", "--ulimit"]
    limits = dict(f.split("=") for f in flags[1::2])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for value in limits.values():
        soft_text, hard_text = value.split(":")
        assert int(soft_text) <= int(hard_text) and (hard == resource.RLIM_INFINITY or int(hard_text) <= hard)


def test_container_runtime_is_chosen_by_name_and_settings() -> None:
    runtime = make_runtime("container", "podman")
    assert isinstance(runtime, ContainerRuntime) and runtime.engine.name == "podman"
    with pytest.raises(ValueError, match="no container engine found"):
        make_runtime("container", "no-such-engine")
    env = {"GPUQUOTA_KAFKA": "k:9092", "GPUQUOTA_NODE_ID": "n1", "GPUQUOTA_RUNTIME": "container"}
    settings = NodeAgentSettings.from_env({**env, "GPUQUOTA_CONTAINER_ENGINE": "docker"})
    assert (settings.runtime_kind, settings.container_engine) == ("container", "docker")
