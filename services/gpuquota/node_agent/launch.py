"""What a runtime is to the node agent: :class:`Runtime`, the :class:`LaunchSpec` it launches, the
:class:`AttemptHandle` it returns, the :class:`Outcome` an attempt ends with and the
:class:`AdoptRecord` a restarted agent adopts it from (I3).

The runtimes (``runtime.py``: process and simulated; ``container.py``) implement this contract and the
multi-instance helpers (``instances.py``) work on it; the agent (``agent.py``) uses nothing else of
them. It sits in a module of its own so that a runtime's helpers need not import the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuquota.node_agent.payload import TrainingRequest

Trace = Callable[[str], None]


class LaunchError(RuntimeError):
    """The attempt cannot start; the message is its ``statusReason``."""


@dataclass(frozen=True)
class LaunchSpec:
    job_id: str
    attempt_id: str
    request: TrainingRequest
    env: dict[str, str]
    """Variables the agent adds (GPUs, job id, checkpoint dir, hyperparameters, ``Environment``)."""
    log_path: Path
    cwd: Path
    instance_gpus: tuple[tuple[int, ...], ...] = ()
    """One entry per instance this node runs (its slot's GPUs); empty: one instance, ``env``'s GPUs."""

    @property
    def instances_here(self) -> int:
        return max(1, len(self.instance_gpus))

    exit_path: Path | None = None
    """Where the runtime records how the attempt ended, for a restarted agent (None: nowhere)."""
    first_rank: int = 0
    """The rank of this node's first instance (an attempt spread over several nodes)."""
    peers: tuple[tuple[str, str], ...] = ()
    """(host name, node address) of every instance of an attempt spread over several nodes, in rank
    order; empty: the whole attempt runs on this node."""


@dataclass(frozen=True)
class Outcome:
    """How an attempt's main process ended. ``exit_code`` None: unknown (see ``reason``)."""

    exit_code: int | None
    signal: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class AdoptRecord:
    """What ``state.json`` remembers of a running attempt, for a restarted agent."""

    runtime: str
    pid: int | None
    pgid: int | None
    start_time: int | None
    exit_path: str | None = None
    """``LaunchSpec.exit_path`` of the attempt (of its first instance; the others' are beside it)."""
    node_id: str = ""
    job_id: str = ""
    attempt_id: str = ""
    """The attempt's id (a runtime may name what it started after it: a container, say)."""
    members: tuple[tuple[int | None, int | None], ...] = ()
    """(pid, start time) of every instance's process (multi-instance ``process`` attempts)."""
    first_rank: int = 0
    """The rank of the node's first instance (``LaunchSpec.first_rank``)."""


class AttemptHandle(Protocol):
    pid: int | None
    pgid: int | None
    start_time: int | None

    async def wait(self) -> Outcome:
        """Returns when the attempt's main process has exited."""
        ...

    async def stop(self, grace: float, trace: Trace) -> None:
        """SIGTERM, ``grace`` seconds, SIGKILL; returns only when nothing of the attempt runs."""
        ...

    async def reap(self) -> None:
        """Kills what is left of the attempt after its main process exited; returns when it is gone."""
        ...


class Runtime(Protocol):
    name: str

    async def launch(self, spec: LaunchSpec) -> AttemptHandle:
        """Starts the attempt; raises :class:`LaunchError` with a readable reason."""
        ...

    def adopt(self, record: AdoptRecord) -> AttemptHandle | None:
        """A handle on an attempt a previous agent started, or None when it no longer runs."""
        ...
