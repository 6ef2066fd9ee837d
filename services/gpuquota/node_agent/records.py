"""What a node agent keeps on disk so that a restarted agent carries on (``work_dir``):

- ``state.json``: every attempt the agent knows, written before it launches the attempt and kept until
  the scheduler has its final report: the ``RunAttempt``, how to adopt it (runtime, pid, process group,
  start time, exit file) and, once it ended, its final report.
- ``finished-attempts``: the ids of the attempts whose final report was delivered, one a line, so that
  a ``RunAttempt`` delivered again (the scheduler republishes after a restart) never runs twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

from gpuquota.node_agent import swapfile
from gpuquota.node_agent.launch import AttemptHandle
from gpuquota.wire.inputs import AttemptReport, AttemptStatus, NodeAttempt
from gpuquota.wire.node_commands import RunAttempt

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
FINISHED_FILE = "finished-attempts"
KEEP_FINISHED = 10_000


class AttemptBook:
    def __init__(self, work_dir: Path, node_id: str) -> None:
        self.work_dir = work_dir
        self.node_id = node_id
        self._unsaved_finished: list[str] = []

    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    @property
    def finished_path(self) -> Path:
        return self.work_dir / FINISHED_FILE

    def load(self) -> dict[str, dict[str, Any]]:
        """The attempt records of ``state.json`` (none when it is missing, unreadable or another node's)."""
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("ignoring unreadable %s: %s", self.state_path, exc)
            return {}
        if not isinstance(doc, dict):
            return {}
        if doc.get("node_id") not in (None, self.node_id):
            log.warning("%s belongs to node %s; ignoring it", self.state_path, doc.get("node_id"))
            return {}
        return dict(doc.get("attempts") or {})

    def save(self, attempts: dict[str, str]) -> None:
        self.write(self.encode(attempts), self.take_finished())

    def encode(self, attempts: dict[str, str]) -> str:
        """The text of ``state.json`` from each attempt's record, already encoded (``Attempt.encoded``):
        a write joins them instead of encoding every attempt it holds again."""
        entries = ",".join(f"{json.dumps(aid)}:{text}" for aid, text in attempts.items())
        return f'{{"node_id":{json.dumps(self.node_id)},"attempts":{{{entries}}}}}'

    def write(self, text: str, finished: list[str] | None = None) -> None:
        """Appends ``finished`` (``take_finished``) to the finished attempts, then replaces ``state.json``
        with ``text`` atomically (any thread; one write at a time), without making or freeing an inode
        (``swapfile``: each freed one made the launches' files dearer)."""
        if finished:
            with open(self.finished_path, "a") as out:
                out.write("".join(f"{aid}\n" for aid in finished))
        swapfile.replace_text(self.state_path, text)

    def finished(self) -> list[str]:
        """The last ``KEEP_FINISHED`` finished attempt ids, oldest first (the file is compacted)."""
        try:
            ids = self.finished_path.read_text().split()
        except FileNotFoundError:
            return []
        if len(ids) > KEEP_FINISHED:
            ids = ids[-KEEP_FINISHED:]
            tmp = self.finished_path.with_suffix(".tmp")
            tmp.write_text("".join(f"{i}\n" for i in ids))
            os.replace(tmp, self.finished_path)
        return ids

    def add_finished(self, attempt_id: str) -> None:
        """Noted for the next write of ``state.json``, which no longer holds the attempt (the agent marks
        the change): the two files change together, off the loop. Appending here, on the loop, once
        per attempt cost the loop 0.5 ms an attempt at 115 starts a second (a system call that gives
        up the GIL to the launch threads)."""
        self._unsaved_finished.append(attempt_id)

    def take_finished(self) -> list[str]:
        """The finished attempts noted since the last take (on the loop, with ``encode``)."""
        taken, self._unsaved_finished = self._unsaved_finished, []
        return taken

    def untake_finished(self, taken: list[str]) -> None:
        """``taken`` were not written after all: the next write appends them (first, as taken)."""
        self._unsaved_finished[:0] = taken


class AttemptPhase(StrEnum):
    """Where an attempt is in the agent's hands (its reported status is ``Attempt.status``)."""

    LAUNCHING = "LAUNCHING"
    """From its ``RunAttempt`` until its process runs (or its launch fails)."""
    RUNNING = "RUNNING"
    """Its process runs, and the scheduler has not asked to stop it."""
    STOP_REQUESTED = "STOP_REQUESTED"
    """The scheduler asked to stop it (``StopAttempt``): being stopped, or stopped before it launched."""
    ENDED = "ENDED"
    """Its process is gone (or never ran); its final report is kept until delivered."""


_LAUNCHING, _RUNNING, _STOP_REQUESTED, _ENDED = AttemptPhase
ATTEMPT_TRANSITIONS: dict[AttemptPhase, frozenset[AttemptPhase]] = {
    _LAUNCHING: frozenset({_RUNNING, _STOP_REQUESTED, _ENDED}),
    _RUNNING: frozenset({_STOP_REQUESTED, _ENDED}),
    _STOP_REQUESTED: frozenset({_ENDED}),
    _ENDED: frozenset(),
}
"""The phases an attempt may move to from each phase (a time limit stops a RUNNING attempt without a
request: it ends from RUNNING)."""


class IllegalAttemptTransition(RuntimeError):
    """An attempt moved to a phase its table does not allow (a bug in the agent)."""


@dataclass
class Attempt:
    """What the agent knows of one attempt, from its ``RunAttempt`` until its final report is delivered."""

    command: RunAttempt
    handle: AttemptHandle | None = None
    stop_reason: str | None = None
    stop_task: asyncio.Task[None] | None = None
    timed_out: bool = False
    adopted: bool = False
    phase: AttemptPhase = AttemptPhase.LAUNCHING
    started_at: float = field(default_factory=time.time)
    max_runtime: float | None = None
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    status: AttemptStatus = "STARTING"
    """The last status reported."""
    final: AttemptReport | None = None
    """The final report, until its send succeeded (then the attempt is forgotten)."""
    checkpoint_at: int | None = None
    """S12: when it last checkpointed (epoch ms), as ``checkpoint_watch`` last found it."""
    _encoded: tuple[tuple[Any, ...], str] | None = field(default=None, repr=False, compare=False)
    """(what the record depends on, the record encoded): ``encoded``'s cache."""

    def move(self, to: AttemptPhase) -> None:
        """Move to phase ``to`` (``ATTEMPT_TRANSITIONS``); moving to the phase it is in changes nothing."""
        if to is not self.phase:
            if to not in ATTEMPT_TRANSITIONS[self.phase]:
                raise IllegalAttemptTransition(f"attempt {self.command.attempt_id}: {self.phase} -> {to}")
            self.phase = to

    @property
    def stoppable(self) -> bool:
        """A stop request still means something: it was not asked before and the process has not ended."""
        return self.phase is AttemptPhase.LAUNCHING or self.phase is AttemptPhase.RUNNING

    @cached_property
    def command_json(self) -> str:
        """The ``RunAttempt`` as ``state.json`` holds it (encoded once: the file is rewritten often)."""
        return json.dumps(self.command.model_dump(mode="json"), separators=(",", ":"))

    def _state(self, runtime: str) -> dict[str, Any]:
        """This attempt's entry in ``state.json``, but its ``command`` and ``final``."""
        handle = self.handle
        return {
            "runtime": runtime,
            "pid": None if handle is None else handle.pid,
            "pgid": None if handle is None else handle.pgid,
            "start_time": None if handle is None else handle.start_time,
            "members": () if handle is None else tuple(getattr(handle, "member_records", ())),
            "started_at": self.started_at,
            "status": self.status,
        }

    def encoded(self, runtime: str) -> str:
        """This attempt's entry in ``state.json``, encoded; encoded again only when it changed (a
        write holds every attempt of the node, and most have not changed since the last one).

        A record changes only through the fields of the key (a handle's pid, group and start time
        are set when it is made); each is compared by identity, so a new value always counts."""
        key = (runtime, self.handle, self.started_at, self.status, self.final)
        cached = self._encoded
        if cached is None or any(old is not new for old, new in zip(cached[0], key, strict=True)):
            final = None if self.final is None else self.final.model_dump(mode="json")
            rest = json.dumps({**self._state(runtime), "final": final}, separators=(",", ":"))
            cached = self._encoded = (key, f'{{"command":{self.command_json},{rest[1:]}')
        return cached[1]

    def known(self) -> NodeAttempt:
        """What the registration and the heartbeats say of this attempt."""
        cmd, final = self.command, self.final
        return NodeAttempt(
            job_id=cmd.job_id,
            attempt_id=cmd.attempt_id,
            status=self.status,
            exit_code=None if final is None else final.exit_code,
            status_reason=None if final is None else final.status_reason,
            checkpoint_at=self.checkpoint_at,
        )
