"""Slot specs, NVML discovery (faked), payload parsing and the ``gpuquota node-agent`` command."""

from __future__ import annotations

import json

import pytest

from gpuquota.config.settings import NodeAgentSettings
from gpuquota.entrypoints.cli import main
from gpuquota.node_agent import (
    INSTANCE_TYPE_GPUS,
    BadPayload,
    ProcessRuntime,
    SimulatedRuntime,
    SlotSpecError,
    discover_slots,
    make_runtime,
    parse_payload,
    parse_slots,
)
from gpuquota.node_agent.payload import hyperparameter_env
from gpuquota.node_agent.slots import node_slot_groups
from gpuquota.wire.base import SlotOffer


def test_catalogue() -> None:
    expected = {
        "ml.g5.xlarge": 1,
        "ml.g5.12xlarge": 4,
        "ml.g5.48xlarge": 8,
        "ml.p4d.24xlarge": 8,
        "ml.p5.48xlarge": 8,
        "ml.g6.xlarge": 1,
        "ml.trn1.32xlarge": 16,
    }
    assert {k: INSTANCE_TYPE_GPUS[k] for k in expected} == expected


def test_parse_slots_assigns_gpus_sequentially() -> None:
    assert parse_slots("ml.g5.xlarge=3") == (
        SlotOffer(unit="ml.g5.xlarge", gpus=(0,)),
        SlotOffer(unit="ml.g5.xlarge", gpus=(1,)),
        SlotOffer(unit="ml.g5.xlarge", gpus=(2,)),
    )
    slots = parse_slots(" ml.g5.xlarge=1 , ml.g5.12xlarge=1,ml.c5.xlarge=1")
    assert slots == (
        SlotOffer(unit="ml.g5.xlarge", gpus=(0,)),
        SlotOffer(unit="ml.g5.12xlarge", gpus=(1, 2, 3, 4)),
        SlotOffer(unit="ml.c5.xlarge", gpus=()),
    )
    assert parse_slots("ml.g5.xlarge=2", with_gpus=False) == (SlotOffer(unit="ml.g5.xlarge"),) * 2
    assert parse_slots("") == ()
    assert parse_slots("ml.g5.xlarge") == (SlotOffer(unit="ml.g5.xlarge", gpus=(0,)),)


@pytest.mark.parametrize("spec", ["=3", "ml.g5.xlarge=x", "ml.g5.xlarge=-1", "a=1,a=2"])
def test_parse_slots_rejects(spec: str) -> None:
    with pytest.raises(SlotSpecError):
        parse_slots(spec)


def test_node_groups_of_gpuquota_up() -> None:
    """``--nodes``: one node per TYPE=SLOTS entry, NODES of them per TYPE=SLOTSxNODES, no GPU shared."""
    g5, g5x12 = "ml.g5.xlarge", "ml.g5.12xlarge"
    nodes = node_slot_groups(f"{g5}=1x2, {g5x12}=1,{g5}=2", discover=parse_slots)
    assert [[(s.unit, s.gpus) for s in node] for node in nodes] == [
        [(g5, (0,))],
        [(g5, (1,))],
        [(g5x12, (4, 5, 6, 7))],
        [(g5, (2,)), (g5, (3,))],
    ]
    assert [len(n) for n in node_slot_groups(f"{g5}=3,ml.p4d.24xlarge", discover=parse_slots)] == [3, 1]
    assert node_slot_groups("", discover=parse_slots) == node_slot_groups(f"{g5}=0x2") == []
    for bad in ("=3", f"{g5}=x2", f"{g5}=1x", f"{g5}=-1", f"{g5}=1x2x3"):
        with pytest.raises(SlotSpecError, match="INSTANCE_TYPE=SLOTSxNODES"):
            node_slot_groups(bad)


def test_discover_slots() -> None:
    # no NVML / no GPUs: the configured slots, without GPU indices
    assert (
        discover_slots(configured="ml.g5.xlarge=2", gpu_count=lambda: 0)
        == (SlotOffer(unit="ml.g5.xlarge"),) * 2
    )
    # GPUs present: configured slots get their indices
    assert discover_slots(configured="ml.g5.12xlarge=2", gpu_count=lambda: 8)[1].gpus == (4, 5, 6, 7)
    with pytest.raises(SlotSpecError, match="need 16 GPUs, NVML found 8"):
        discover_slots(configured="ml.g5.12xlarge=4", gpu_count=lambda: 8)
    # GPUs present, nothing configured: one default-unit slot per GPU
    assert [s.gpus for s in discover_slots(gpu_count=lambda: 2)] == [(0,), (1,)]
    # the real probe works without pynvml (not a dependency)
    assert isinstance(discover_slots(configured="ml.g5.xlarge=1"), tuple)


def test_parse_payload() -> None:
    request = parse_payload(
        json.dumps(
            {
                "AlgorithmSpecification": {
                    "ContainerEntrypoint": ["python", "train.py"],
                    "ContainerArguments": ["-v"],
                },
                "Environment": {"A": "1"},
                "HyperParameters": {"lr": "0.1", "batch-size": 32},
                "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2},
                "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
                "CheckpointConfig": {"S3Uri": "s3://b/c", "LocalPath": "/opt/ml/checkpoints"},
            }
        )
    )
    assert request.command == ("python", "train.py", "-v")
    assert (request.instance_type, request.instance_count, request.max_runtime_seconds) == (
        "ml.g5.xlarge",
        2,
        86400,
    )
    assert request.checkpoint_local_path == "/opt/ml/checkpoints"
    assert hyperparameter_env(request.hyperparameters) == {"SM_HP_LR": "0.1", "SM_HP_BATCH_SIZE": "32"}
    assert parse_payload("").command == ()
    for bad in ("[1]", '{"StoppingCondition": {"MaxRuntimeInSeconds": 0}}', '{"Environment": {"A": [1]}}'):
        with pytest.raises(BadPayload, match="Invalid serviceRequestPayload"):
            parse_payload(bad)


def test_runtimes_and_settings_aliases() -> None:
    assert isinstance(make_runtime("process"), ProcessRuntime)
    assert isinstance(make_runtime("subprocess"), ProcessRuntime)
    assert isinstance(make_runtime("simulated"), SimulatedRuntime)
    env = {"GPUQUOTA_KAFKA": "k:9092", "GPUQUOTA_NODE_ID": "n1"}
    settings = NodeAgentSettings.from_env({**env, "GPUQUOTA_RUNTIME": "fake", "GPUQUOTA_GPUS": "4"})
    assert (settings.runtime_kind, settings.slot_spec) == ("simulated", "ml.g5.xlarge=4")
    settings = NodeAgentSettings.from_env({**env, "GPUQUOTA_SLOTS": "ml.p4d.24xlarge=1"})
    assert (settings.runtime_kind, settings.slot_spec) == ("process", "ml.p4d.24xlarge=1")


def test_cli_check_prints_the_node(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUQUOTA_POOL", "from-env")
    argv = ["node-agent", "--check", "--kafka", "k:9092", "--node-id", "n1", "--slots", "ml.g5.xlarge=2"]
    argv += [
        "--runtime",
        "simulated",
        "--preemption-grace",
        "2.5",
        "--heartbeat-seconds",
        "1",
        "--work-dir",
        "/tmp/w",
    ]
    assert main(argv) == 0
    node = json.loads(capsys.readouterr().out)
    assert node["node_id"] == "n1" and node["pool"] == "from-env" and node["runtime"] == "simulated"
    assert (node["preemption_grace"], node["heartbeat_seconds"], node["work_dir"]) == (2.5, 1.0, "/tmp/w")
    assert [s["unit"] for s in node["slots"]] == ["ml.g5.xlarge", "ml.g5.xlarge"]


def test_cli_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUQUOTA_KAFKA", "GPUQUOTA_NODE_ID"):
        monkeypatch.delenv(name, raising=False)
    assert main(["node-agent", "--check", "--kafka", "k:9092", "--slots", "ml.g5.xlarge=x"]) == 2
    assert "GPUQUOTA_NODE_ID" in capsys.readouterr().err
    assert main(["node-agent", "--kafka", "k:9092"]) == 2  # not --check: still validated first
    assert "GPUQUOTA_NODE_ID" in capsys.readouterr().err


def test_nvml_probe_with_a_fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from gpuquota.node_agent.slots import _nvml_gpu_count

    calls: list[str] = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: 4  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert _nvml_gpu_count() == 4 and calls == ["init", "shutdown"]
    assert [s.gpus for s in discover_slots(configured="ml.g5.xlarge=1,ml.g5.12xlarge=0")] == [(0,)]

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = no_driver  # type: ignore[attr-defined]
    assert _nvml_gpu_count() == 0
    assert discover_slots(configured="ml.g5.xlarge=1") == (SlotOffer(unit="ml.g5.xlarge"),)
