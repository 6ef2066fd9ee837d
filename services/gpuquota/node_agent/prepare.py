"""From a ``RunAttempt`` to a ``LaunchSpec``: the checks, the job's environment and its directories.

Every directory a job sees (``SM_CHECKPOINT_DIR``, its log, its working directory, its exit file) is
absolute: the job's working directory is the node's work directory or the one it was submitted from
(``instances.working_dir``), so a relative path would resolve elsewhere (``gpuquota up`` with its
default, relative ``--data-dir``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuquota.adapters.attempt_logs import safe_name
from gpuquota.node_agent.instances import attempt_root, host_name
from gpuquota.node_agent.launch import LaunchSpec
from gpuquota.node_agent.payload import BadPayload, TrainingRequest, hyperparameter_env, parse_payload
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import InstanceOutput
from gpuquota.wire.node_commands import RunAttempt


def exit_path(work_dir: Path, attempt_id: str) -> Path:
    """Where the attempt's exit status is recorded (``exit_wrapper.py``)."""
    return work_dir.absolute() / "exits" / f"{safe_name(attempt_id)}.json"


def prepare(
    cmd: RunAttempt, node_id: str, slots: tuple[SlotOffer, ...], work_dir: Path, *, contained: bool = False
) -> LaunchSpec:
    """The launch spec of ``cmd``; raises :class:`BadPayload` with the reason it cannot run here.

    ``contained``: the runtime binds the checkpoint directory at ``CheckpointConfig.LocalPath`` inside the
    container, so on the node it is the job's own directory.
    """
    work_dir = work_dir.absolute()
    offered = sorted({s.unit for s in slots})
    request = parse_payload(cmd.payload)
    for unit in filter(None, (cmd.unit, request.instance_type)):
        if unit not in offered:
            offers = ", ".join(offered) or "nothing"
            raise BadPayload(f"Instance type {unit} is not offered by node {node_id} (offers: {offers})")
    for index in cmd.slots:
        if not 0 <= index < len(slots) or slots[index].unit != cmd.unit:
            raise BadPayload(f"Node {node_id} has no {cmd.unit} slot {index}")
    gpus = cmd.gpus or tuple(g for i in cmd.slots for g in slots[i].gpus)
    checkpoint = _checkpoint_dir(cmd, request, work_dir, contained)
    env = {
        **request.environment,
        **hyperparameter_env(request.hyperparameters),
        "SM_HPS": json.dumps(request.hyperparameters, sort_keys=True),
        "SM_CURRENT_INSTANCE_TYPE": cmd.unit,
        "SM_NUM_GPUS": str(len(gpus)),
        "SM_CHECKPOINT_DIR": str(checkpoint),
        # SageMaker's own; the SDK's drivers (sm_drivers/scripts/environment.py) require it
        "TRAINING_JOB_NAME": request.training_job_name or cmd.job_name,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        "GPUQUOTA_JOB_ID": cmd.job_id,
        "GPUQUOTA_JOB_NAME": cmd.job_name,
        "GPUQUOTA_ATTEMPT": str(cmd.attempt_number),
        "GPUQUOTA_ATTEMPT_ID": cmd.attempt_id,
        "GPUQUOTA_NODE_ID": node_id,
    }
    return LaunchSpec(
        job_id=cmd.job_id,
        attempt_id=cmd.attempt_id,
        request=request,
        env=env,
        log_path=work_dir / "logs" / f"{safe_name(cmd.attempt_id)}.log",
        cwd=work_dir,
        exit_path=exit_path(work_dir, cmd.attempt_id),
        instance_gpus=tuple(slots[i].gpus for i in cmd.slots) if len(cmd.slots) > 1 else (),
        first_rank=_first_rank(cmd, node_id),
        peers=tuple((host_name(n.first_rank + i), n.address) for n in cmd.gang for i in range(n.instances)),
    )


async def prepared_and_recorded(
    cmd: RunAttempt,
    node_id: str,
    slots: tuple[SlotOffer, ...],
    work_dir: Path,
    recorded: Callable[[], Awaitable[None]],
    *,
    contained: bool = False,
) -> LaunchSpec:
    """``prepare(cmd)`` on a worker thread (the checkpoint directory is a system call, about 0.5 ms of
    the loop on a busy disk) while ``recorded()`` puts the attempt's record on disk (the agent's
    ``StateSaver.durable``: before its launch, for a restarted agent). Neither needs the other, so they
    go side by side: a launch waits for the longer of the two, not both. A record whose spec then fails
    is harmless: the attempt is reported FAILED, and a restart before that report is delivered finds
    no process for it (lost: requeued, as when the agent died before recording it)."""
    made = asyncio.ensure_future(
        asyncio.to_thread(prepare, cmd, node_id, slots, work_dir, contained=contained)
    )
    try:
        await recorded()
    except BaseException:
        made.cancel()
        raise
    return await made


def attempt_outputs(cmd: RunAttempt, work_dir: Path) -> tuple[InstanceOutput, ...]:
    """Where the node's instances of ``cmd`` kept ``/opt/ml/model`` and ``/opt/ml/output`` (I6): the
    directories the runtime made (none: a simulated attempt, or one that never started)."""
    first = next((n.first_rank for n in cmd.gang if n.node_id == cmd.node_id), 0)
    root = attempt_root(work_dir.absolute(), cmd.attempt_id)
    hosts = [host_name(first + i) for i in range(max(1, len(cmd.slots)))]
    return tuple(
        InstanceOutput(host=h, model_dir=str(root / h / "model"), output_dir=str(root / h / "output"))
        for h in hosts
        if (root / h / "model").is_dir()
    )


def checkpoint_dir(cmd: RunAttempt, work_dir: Path, *, contained: bool = False) -> Path | None:
    """The job's checkpoint directory on the node, as ``prepare`` makes it (an attempt adopted after a
    restart has no spec); None when the payload cannot be read or the directory cannot be made."""
    try:
        return _checkpoint_dir(cmd, parse_payload(cmd.payload), work_dir.absolute(), contained)
    except BadPayload:
        return None


def _first_rank(cmd: RunAttempt, node_id: str) -> int:
    """The rank of this node's first instance in the attempt's gang (0 when the attempt is all here)."""
    if not cmd.gang:
        return 0
    for node in cmd.gang:
        if node.node_id == node_id:
            if node.instances != len(cmd.slots):
                raise BadPayload(
                    f"Node {node_id} was given {len(cmd.slots)} slots for {node.instances} instances"
                )
            return node.first_rank
    raise BadPayload(f"Node {node_id} is not in the placement of attempt {cmd.attempt_id}")


def _checkpoint_dir(cmd: RunAttempt, request: TrainingRequest, work_dir: Path, contained: bool) -> Path:
    if request.checkpoint_local_path and not contained:
        path = work_dir / request.checkpoint_local_path  # an absolute LocalPath wins
    else:
        path = work_dir / "checkpoints" / safe_name(cmd.job_id)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadPayload(f"Checkpoint directory {path} cannot be created: {exc.strerror or exc}") from None
    if not path.is_dir() or not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise BadPayload(f"Checkpoint directory {path} is not readable and writable")
    return path
