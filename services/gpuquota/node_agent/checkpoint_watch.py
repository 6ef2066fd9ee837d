"""When each running attempt last checkpointed (semantics S12), for the heartbeats to report.

An attempt's last checkpoint is the newest file of its checkpoint directory (``SM_CHECKPOINT_DIR`` on
the node: ``prepare.checkpoint_dir``) or, when its job has ``CheckpointConfig.S3Uri`` and the agent an
S3 store, the newest file its last completed upload carried (``DataPlane.uploaded``): with S3 the
checkpoint that counts is the one another node could resume from. The scan runs on a worker thread
before each heartbeat; a directory that is missing or unreadable reports no checkpoint.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuquota.node_agent.prepare import checkpoint_dir
from gpuquota.node_agent.records import Attempt, AttemptPhase

PARTIAL_SUFFIX = ".gpuquota-part"
"""A download in progress (``s3_transfer``): not a checkpoint."""


def newest_mtime_ms(root: Path) -> int | None:
    """The newest modification time of the files under ``root`` (epoch ms), or None."""
    newest: int | None = None
    stack = [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file() and not entry.name.endswith(PARTIAL_SUFFIX):
                    mtime = entry.stat().st_mtime_ns // 1_000_000
                    newest = mtime if newest is None else max(newest, mtime)
            except OSError:
                continue  # removed while we walked
    return newest


def _scan(attempts: list[Attempt], work_dir: Path, contained: bool, uploaded: Mapping[str, int]) -> None:
    for att in attempts:
        cmd = att.command
        if cmd.attempt_id in uploaded:
            att.checkpoint_at = uploaded[cmd.attempt_id]
            continue
        local = checkpoint_dir(cmd, work_dir, contained=contained)
        if local is not None:
            att.checkpoint_at = newest_mtime_ms(local)


async def refresh(
    attempts: Iterable[Attempt], work_dir: Path, contained: bool, uploaded: Mapping[str, int]
) -> None:
    """Set ``checkpoint_at`` of each running attempt (the others have nothing more to lose)."""
    running = [a for a in attempts if a.phase is AttemptPhase.RUNNING]
    if running:
        await asyncio.to_thread(_scan, running, work_dir, contained, dict(uploaded))
