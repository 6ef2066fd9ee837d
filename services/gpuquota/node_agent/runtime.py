"""How attempts run: the :class:`Runtime` protocol, the ``process`` and ``simulated`` runtimes (I3)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuquota.node_agent import procs
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
    node_id: str = ""
    job_id: str = ""
    attempt_id: str = ""
    members: tuple[tuple[int, int | None], ...] = ()
    """(pid, start time) of every instance's process (multi-instance ``process`` attempts)."""


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


# ----- process runtime -----------------------------------------------------------------------------


class ProcessHandle:
    """A process group: our child (``proc``) or one adopted from a previous agent (polled)."""

    def __init__(
        self,
        pid: int,
        proc: asyncio.subprocess.Process | None = None,
        start_time: int | None = None,
        poll_seconds: float = 0.05,
    ) -> None:
        self.pid: int | None = pid
        self.pgid: int | None = pid  # start_new_session: the child leads its own group
        self.start_time = start_time
        self._proc = proc
        self._poll = poll_seconds

    async def wait(self) -> Outcome:
        assert self.pid is not None and self.pgid is not None
        if self._proc is not None:
            rc = await self._proc.wait()
            return Outcome(exit_code=None, signal=-rc) if rc < 0 else Outcome(exit_code=rc)
        # adopted: not our child, so no exit status; wait for the whole group to go
        while procs.group_alive(self.pgid):
            await asyncio.sleep(self._poll)
        return Outcome(exit_code=None, reason="exit status unknown")

    async def _gone(self, deadline: float | None) -> bool:
        assert self.pgid is not None
        while procs.group_alive(self.pgid):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self._poll)
        return True

    async def stop(self, grace: float, trace: Trace) -> None:
        assert self.pgid is not None
        # the trace is written just before the signal, so its time never follows the job's reaction
        if procs.group_alive(self.pgid):
            trace(f"SIGTERM sent to process group {self.pgid}")
            procs.signal_group(self.pgid, signal.SIGTERM)
        if not await self._gone(time.monotonic() + grace):
            trace(f"SIGKILL sent to process group {self.pgid} after {grace:g} s grace")
            procs.signal_group(self.pgid, signal.SIGKILL)
            await self._gone(None)
        await self._reap_leader()
        trace(f"process group {self.pgid} gone")

    async def reap(self) -> None:
        assert self.pgid is not None
        if procs.group_alive(self.pgid):
            procs.signal_group(self.pgid, signal.SIGKILL)
            await self._gone(None)
        await self._reap_leader()

    async def _reap_leader(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            await self._proc.wait()


class ProcessRuntime:
    """Runs the payload's command as a local process in its own process group (session)."""

    name = "process"

    def __init__(self, poll_seconds: float = 0.05, inherit_env: bool = True) -> None:
        self._poll = poll_seconds
        self._inherit_env = inherit_env

    async def launch(self, spec: LaunchSpec) -> AttemptHandle:
        from gpuquota.node_agent import instances

        argv = spec.request.command
        if not argv:
            raise LaunchError(
                "No command to run: the payload has no AlgorithmSpecification.ContainerEntrypoint "
                "or ContainerArguments"
            )
        local = instances.local_instances(spec)
        port = instances.free_port() if len(local) > 1 else 0
        handles: list[AttemptHandle] = []
        try:
            for instance in local:
                env = {**spec.env, **instances.instance_env(spec, instance, "localhost", port)}
                log = spec.log_path
                if instance.rank > 0:
                    log = log.with_name(f"{log.stem}.{instance.host}{log.suffix}")
                handles.append(await self._start(argv, env, log, spec.cwd))
        except BaseException:
            for handle in handles:
                await handle.reap()
            raise
        if len(handles) == 1:
            return handles[0]
        return instances.GroupHandle(handles, [i.host for i in local])

    async def _start(
        self, argv: tuple[str, ...], env: dict[str, str], log_path: Path, cwd: Path
    ) -> ProcessHandle:
        env = {**os.environ, **env} if self._inherit_env else env
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log_path, "ab") as log:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
        except FileNotFoundError:
            raise LaunchError(f"Cannot start the attempt: command not found: {argv[0]}") from None
        except PermissionError:
            raise LaunchError(f"Cannot start the attempt: permission denied: {argv[0]}") from None
        except OSError as exc:
            raise LaunchError(f"Cannot start the attempt: {argv[0]}: {exc.strerror or exc}") from None
        return ProcessHandle(proc.pid, proc, procs.start_time(proc.pid), self._poll)

    def adopt(self, record: AdoptRecord) -> AttemptHandle | None:
        if record.runtime != self.name or record.pid is None or record.pgid is None:
            return None
        if len(record.members) > 1:
            return self._adopt_group(record)
        return self._adopt_one(record.pid, record.pgid, record.start_time)

    def _adopt_one(self, pid: int, pgid: int, start_time: int | None) -> ProcessHandle | None:
        leader_ok = procs.pid_alive(pid, start_time)
        if not leader_ok and (procs.pid_alive(pid) or not procs.group_alive(pgid)):
            return None  # the pid was reused by someone else, or the group is gone
        return ProcessHandle(pid, None, start_time, self._poll)

    def _adopt_group(self, record: AdoptRecord) -> AttemptHandle | None:
        from gpuquota.node_agent import instances

        members = [self._adopt_one(pid, pid, started) for pid, started in record.members]
        alive = [m for m in members if m is not None]
        if not alive:
            return None
        # a member gone at restart ended with an unknown status: the group fails and stops the others
        handles: list[AttemptHandle] = [m or _Gone() for m in members]
        return instances.GroupHandle(handles, [instances.host_name(r) for r in range(len(members))])


class _Gone:
    """An instance that had already ended when the agent restarted (exit status unknown)."""

    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None

    async def wait(self) -> Outcome:
        return Outcome(exit_code=None, reason="exit status unknown (ended while the node agent was down)")

    async def stop(self, grace: float, trace: Trace) -> None:
        return None

    async def reap(self) -> None:
        return None


# ----- simulated runtime ---------------------------------------------------------------------------

SIM_DURATION = "GPUQUOTA_SIM_DURATION_SECONDS"
SIM_EXIT_CODE = "GPUQUOTA_SIM_EXIT_CODE"


@dataclass
class SimulatedHandle:
    duration: float
    exit_code: int
    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self) -> Outcome:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), self.duration)
        if self._stopped.is_set():
            return Outcome(exit_code=None, signal=signal.SIGTERM)
        return Outcome(exit_code=self.exit_code)

    async def stop(self, grace: float, trace: Trace) -> None:
        self._stopped.set()
        trace("simulated attempt stopped")

    async def reap(self) -> None:
        return None


class SimulatedRuntime:
    """No process: an attempt "runs" for ``Environment.GPUQUOTA_SIM_DURATION_SECONDS`` (default 60)
    and ends with ``GPUQUOTA_SIM_EXIT_CODE`` (default 0); stopping is immediate."""

    name = "simulated"

    def __init__(self, default_duration: float = 60.0) -> None:
        self.default_duration = default_duration

    async def launch(self, spec: LaunchSpec) -> AttemptHandle:
        env = spec.request.environment
        try:
            duration = float(env.get(SIM_DURATION, self.default_duration))
            exit_code = int(env.get(SIM_EXIT_CODE, "0"))
        except ValueError as exc:
            raise LaunchError(f"Invalid simulation settings in Environment: {exc}") from None
        if not duration >= 0:
            raise LaunchError(f"Invalid simulation settings in Environment: {SIM_DURATION} must be >= 0")
        return SimulatedHandle(duration=duration, exit_code=exit_code)

    def adopt(self, record: AdoptRecord) -> AttemptHandle | None:
        return None  # simulated attempts die with their agent


def describe(record: dict[str, Any]) -> AdoptRecord:
    raw = record.get("command")
    command: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return AdoptRecord(
        runtime=str(record.get("runtime", "")),
        pid=record.get("pid"),
        pgid=record.get("pgid"),
        start_time=record.get("start_time"),
        node_id=str(command.get("node_id", "")),
        job_id=str(command.get("job_id", "")),
        attempt_id=str(command.get("attempt_id", "")),
        members=tuple((int(m[0]), m[1]) for m in record.get("members") or () if m and m[0] is not None),
    )
