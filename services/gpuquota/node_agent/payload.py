"""What a node agent reads of a SageMaker ``CreateTrainingJob`` request (``serviceRequestPayload``, I3)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


class BadPayload(ValueError):
    """The payload cannot be run; the message is the attempt's ``statusReason``."""


@dataclass(frozen=True)
class InputChannel:
    """One ``InputDataConfig`` entry: its name, its ``S3Uri`` and the rest (``inputdataconfig.json``)."""

    name: str
    uri: str
    settings: dict[str, Any] = field(default_factory=dict)
    data_type: str = "S3Prefix"
    """``S3DataSource.S3DataType``: ``S3Prefix`` (every object under the URI) or ``ManifestFile``."""
    input_mode: str = "File"
    """The channel's ``InputMode``, else ``AlgorithmSpecification.TrainingInputMode``, else ``File``."""


@dataclass(frozen=True)
class TrainingRequest:
    entrypoint: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    instance_type: str | None = None
    instance_count: int = 1
    max_runtime_seconds: float | None = None
    checkpoint_local_path: str | None = None
    training_image: str | None = None
    channels: tuple[InputChannel, ...] = ()
    training_job_name: str | None = None
    output_path: str | None = None
    """``OutputDataConfig.S3OutputPath``: where ``model.tar.gz`` and ``output.tar.gz`` go."""
    checkpoint_uri: str | None = None
    """``CheckpointConfig.S3Uri``: the checkpoint directory's copy in S3."""
    role_arn: str | None = None

    @property
    def command(self) -> tuple[str, ...]:
        return self.entrypoint + self.arguments


def _obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadPayload(f"Invalid serviceRequestPayload: {where} must be an object")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadPayload(f"Invalid serviceRequestPayload: {where} must be a list of strings")
    return tuple(value)


def _str_map(value: Any, where: str) -> dict[str, str]:
    raw = _obj(value, where)
    out: dict[str, str] = {}
    for key, item in raw.items():
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise BadPayload(f"Invalid serviceRequestPayload: {where}.{key} must be a string")
        out[str(key)] = str(item)
    return out


def parse_payload(payload: str) -> TrainingRequest:
    """Parses ``payload``; an empty payload is an empty request. Raises :class:`BadPayload`."""
    if not payload.strip():
        return TrainingRequest()
    try:
        doc = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise BadPayload(f"Invalid serviceRequestPayload: not valid JSON ({exc.msg} at {exc.pos})") from None
    doc = _obj(doc, "the payload")
    algo = _obj(doc.get("AlgorithmSpecification"), "AlgorithmSpecification")
    resources = _obj(doc.get("ResourceConfig"), "ResourceConfig")
    stopping = _obj(doc.get("StoppingCondition"), "StoppingCondition")
    checkpoint = _obj(doc.get("CheckpointConfig"), "CheckpointConfig")

    max_runtime = stopping.get("MaxRuntimeInSeconds")
    if max_runtime is not None and (
        isinstance(max_runtime, bool) or not isinstance(max_runtime, int | float) or max_runtime <= 0
    ):
        raise BadPayload("Invalid serviceRequestPayload: StoppingCondition.MaxRuntimeInSeconds must be > 0")
    instance_type = resources.get("InstanceType")
    if instance_type is not None and not isinstance(instance_type, str):
        raise BadPayload("Invalid serviceRequestPayload: ResourceConfig.InstanceType must be a string")
    count = resources.get("InstanceCount", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadPayload("Invalid serviceRequestPayload: ResourceConfig.InstanceCount must be >= 1")
    local_path = checkpoint.get("LocalPath")
    if local_path is not None and (not isinstance(local_path, str) or not local_path):
        raise BadPayload("Invalid serviceRequestPayload: CheckpointConfig.LocalPath must be a path")
    image = algo.get("TrainingImage")
    if image is not None and (not isinstance(image, str) or not image):
        raise BadPayload(
            "Invalid serviceRequestPayload: AlgorithmSpecification.TrainingImage must be a string"
        )
    mode = algo.get("TrainingInputMode", "File")
    return TrainingRequest(
        training_image=image,
        channels=_channels(doc.get("InputDataConfig"), mode if isinstance(mode, str) else "File"),
        training_job_name=_optional_str(doc.get("TrainingJobName"), "TrainingJobName"),
        output_path=_optional_str(
            _obj(doc.get("OutputDataConfig"), "OutputDataConfig").get("S3OutputPath"),
            "OutputDataConfig.S3OutputPath",
        ),
        checkpoint_uri=_optional_str(checkpoint.get("S3Uri"), "CheckpointConfig.S3Uri"),
        role_arn=_optional_str(doc.get("RoleArn"), "RoleArn"),
        entrypoint=_strings(algo.get("ContainerEntrypoint"), "AlgorithmSpecification.ContainerEntrypoint"),
        arguments=_strings(algo.get("ContainerArguments"), "AlgorithmSpecification.ContainerArguments"),
        environment=_str_map(doc.get("Environment"), "Environment"),
        hyperparameters=_str_map(doc.get("HyperParameters"), "HyperParameters"),
        instance_type=instance_type,
        instance_count=count,
        max_runtime_seconds=float(max_runtime) if max_runtime is not None else None,
        checkpoint_local_path=local_path,
    )


def _optional_str(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadPayload(f"Invalid serviceRequestPayload: {where} must be a string")
    return value


def _channels(value: Any, default_mode: str = "File") -> tuple[InputChannel, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadPayload("Invalid serviceRequestPayload: InputDataConfig must be a list")
    channels: list[InputChannel] = []
    for item in value:
        entry = _obj(item, "InputDataConfig[]")
        name = entry.get("ChannelName")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9.\-_]{1,64}", name):
            raise BadPayload(
                "Invalid serviceRequestPayload: InputDataConfig[].ChannelName must be a channel name"
            )
        source = _obj(
            _obj(entry.get("DataSource"), "InputDataConfig[].DataSource").get("S3DataSource"), "S3DataSource"
        )
        uri = source.get("S3Uri")
        if not isinstance(uri, str) or not uri:
            raise BadPayload(
                f"Invalid serviceRequestPayload: channel {name} has no DataSource.S3DataSource.S3Uri"
            )
        settings = {k: v for k, v in entry.items() if k not in ("ChannelName", "DataSource")}
        data_type = source.get("S3DataType", "S3Prefix")
        mode = entry.get("InputMode", default_mode)
        channels.append(
            InputChannel(
                name=name,
                uri=uri,
                settings=settings,
                data_type=data_type if isinstance(data_type, str) else "S3Prefix",
                input_mode=mode if isinstance(mode, str) else "File",
            )
        )
    if len({c.name for c in channels}) != len(channels):
        raise BadPayload("Invalid serviceRequestPayload: InputDataConfig has a channel name twice")
    return tuple(channels)


def hyperparameter_env(hyperparameters: dict[str, str]) -> dict[str, str]:
    """``SM_HP_<NAME>`` variables: the name upper-cased, characters outside ``[A-Z0-9_]`` become ``_``."""
    return {
        "SM_HP_" + re.sub(r"[^A-Z0-9_]", "_", name.upper()): value for name, value in hyperparameters.items()
    }
