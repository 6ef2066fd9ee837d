"""Process-group helpers (Linux ``/proc``, with a ``killpg(pgid, 0)`` fallback elsewhere).

A zombie (exited, not yet reaped) counts as gone: in containers PID 1 may never reap orphans.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (``[state, ppid, pgrp, ...]``)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (guards against pid reuse); None if unknown."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def pid_alive(pid: int, started: int | None = None) -> bool:
    if _PROC.is_dir():
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return started is None or len(fields) <= 19 or int(fields[19]) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    if not _PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members: list[int] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # no process at all, not even a zombie: no need to read every /proc entry
    except PermissionError:
        pass
    if _leads_live_group(pgid):
        return True  # the leader itself runs: the usual case while an attempt runs
    return bool(group_members(pgid))


def _leads_live_group(pgid: int) -> bool:
    """Process ``pgid`` runs (not a zombie) and still leads group ``pgid`` (its pid was not reused)."""
    fields = _stat_fields(pgid)
    return fields is not None and len(fields) > 2 and fields[0] not in ("Z", "X") and fields[2] == str(pgid)


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Sends ``sig`` to the group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
