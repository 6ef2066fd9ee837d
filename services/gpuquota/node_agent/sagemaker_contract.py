"""SageMaker's training container contract (I6): what an instance's container sees under ``/opt/ml``.

For each instance the node keeps ``<work dir>/attempts/<attempt>/<host>/`` with ``input/config/``
(``hyperparameters.json``, ``resourceconfig.json``, ``inputdataconfig.json``), ``model/`` and
``output/``; they are bound to ``/opt/ml/input/config`` (read-only), ``/opt/ml/model`` and
``/opt/ml/output``. Channels whose ``S3Uri`` is a ``file://`` URI or an absolute path on the node are
bound read-only to ``/opt/ml/input/data/<channel>``; an ``s3://`` channel, which the agent downloaded
into the attempt's channel directory (``s3_stage``) when it has an S3 endpoint, is bound read-write
there (the SDK's drivers ``chmod`` their scripts); without an endpoint it fails the attempt at launch.
The job's checkpoint directory (kept across attempts) is bound to ``CheckpointConfig.LocalPath`` or
``/opt/ml/checkpoints``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from gpuquota.node_agent.instances import Instance, attempt_root, host_name, total_instances
from gpuquota.node_agent.launch import LaunchError, LaunchSpec
from gpuquota.node_agent.payload import InputChannel

ML = "/opt/ml"
CHECKPOINTS = f"{ML}/checkpoints"
FAILURE_FILE = "failure"
FAILURE_BYTES = 1024
NETWORK_INTERFACE = "eth0"
_CHANNEL_DEFAULTS = {
    "TrainingInputMode": "File",
    "S3DistributionType": "FullyReplicated",
    "RecordWrapperType": "None",
}
#: the agent's variables that name host paths or host GPU indices: replaced inside a container
_HOST_ONLY = ("CUDA_VISIBLE_DEVICES",)


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool

    def flag(self) -> str:
        return f"type=bind,source={self.source},target={self.target}" + (
            ",readonly" if self.read_only else ""
        )


@dataclass(frozen=True)
class InstanceLayout:
    """One instance's directories on the node, its mounts and its environment."""

    root: Path
    mounts: tuple[Mount, ...]
    env: dict[str, str]

    @property
    def failure_file(self) -> Path:
        return self.root / "output" / FAILURE_FILE


def attempt_dir(spec: LaunchSpec) -> Path:
    return attempt_root(spec.cwd, spec.attempt_id)


def channel_source(channel: InputChannel) -> Path:
    """The node path of a channel; :class:`LaunchError` for a URI the node cannot read."""
    uri = channel.uri
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        path = Path(unquote(parsed.path))
    elif uri.startswith("/"):
        path = Path(uri)
    else:
        raise LaunchError(
            f"Channel {channel.name}: {uri} is not on this node; without an S3 endpoint "
            "(GPUQUOTA_S3_ENDPOINT_URL) the node agent reads channels from file:// URIs or absolute "
            "paths only"
        )
    if not path.exists():
        raise LaunchError(f"Channel {channel.name}: {path} does not exist on this node")
    return path


def channel_mount(spec: LaunchSpec, channel: InputChannel) -> Mount:
    """A node path read-only; a downloaded S3 channel (``SM_CHANNEL_<NAME>`` names its directory)
    read-write, as SageMaker's File mode gives it."""
    target = f"{ML}/input/data/{channel.name}"
    downloaded = spec.env.get("SM_CHANNEL_" + re.sub(r"[^A-Z0-9_]", "_", channel.name.upper()))
    if channel.uri.startswith("s3://") and downloaded:
        return Mount(Path(downloaded), target, read_only=False)
    return Mount(channel_source(channel), target, read_only=True)


def checkpoint_target(spec: LaunchSpec) -> str:
    return spec.request.checkpoint_local_path or CHECKPOINTS


def job_checkpoint_dir(spec: LaunchSpec) -> Path:
    """The job's checkpoint directory on the node (the agent created it), kept across attempts."""
    return Path(spec.env["SM_CHECKPOINT_DIR"])


def read_failure(path: Path) -> str | None:
    """The first 1,024 bytes of ``/opt/ml/output/failure`` (``path`` on the node), when written."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(FAILURE_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None


def prepare_instance(spec: LaunchSpec, instance: Instance, instance_env: dict[str, str]) -> InstanceLayout:
    """Writes the instance's config files and returns its layout; raises :class:`LaunchError`."""
    request = spec.request
    root = attempt_dir(spec) / instance.host
    config = root / "input" / "config"
    try:
        for sub in (config, root / "model", root / "output" / "data"):
            sub.mkdir(parents=True, exist_ok=True)
        (root / "output" / FAILURE_FILE).unlink(missing_ok=True)
        total = total_instances(spec)
        resource = {
            "current_host": instance.host,
            "current_instance_type": request.instance_type or spec.env.get("SM_CURRENT_INSTANCE_TYPE", ""),
            "hosts": [host_name(r) for r in range(total)],
            "network_interface_name": NETWORK_INTERFACE,
        }
        channels = {c.name: {**_CHANNEL_DEFAULTS, **c.settings} for c in request.channels}
        _write_json(config / "hyperparameters.json", request.hyperparameters)
        _write_json(config / "resourceconfig.json", resource)
        _write_json(config / "inputdataconfig.json", channels)
    except OSError as exc:
        raise LaunchError(f"Cannot prepare {root}: {exc.strerror or exc}") from None
    mounts = [
        Mount(config, f"{ML}/input/config", read_only=True),
        Mount(root / "model", f"{ML}/model", read_only=False),
        Mount(root / "output", f"{ML}/output", read_only=False),
        Mount(job_checkpoint_dir(spec), checkpoint_target(spec), read_only=False),
    ]
    mounts += [channel_mount(spec, c) for c in request.channels]
    return InstanceLayout(root, tuple(mounts), container_env(spec, instance_env))


def container_env(spec: LaunchSpec, instance_env: dict[str, str]) -> dict[str, str]:
    """The agent's variables with container paths instead of node paths, plus the ``SM_*`` paths."""
    channels = [c.name for c in spec.request.channels]
    env = {k: v for k, v in {**spec.env, **instance_env}.items() if k not in _HOST_ONLY}
    env |= {
        "SM_MODEL_DIR": f"{ML}/model",
        "SM_OUTPUT_DIR": f"{ML}/output",
        "SM_OUTPUT_DATA_DIR": f"{ML}/output/data",
        "SM_INPUT_DIR": f"{ML}/input",
        "SM_INPUT_CONFIG_DIR": f"{ML}/input/config",
        "SM_CHECKPOINT_DIR": checkpoint_target(spec),
        "SM_CHANNELS": json.dumps(channels),
        "SM_NETWORK_INTERFACE_NAME": NETWORK_INTERFACE,
    }
    env |= {"SM_CHANNEL_" + re.sub(r"[^A-Z0-9_]", "_", c.upper()): f"{ML}/input/data/{c}" for c in channels}
    return env


def _write_json(path: Path, doc: object) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
