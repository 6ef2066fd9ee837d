"""How attempts run: the ``process`` and ``simulated`` runtimes (I3) of the contract in ``launch.py``.

Recovery seam: the agent records each attempt (``AdoptRecord``) before it launches it. A restarted agent
calls ``Runtime.adopt(record)``, which returns a handle on the attempt if it still runs, a handle that
has already ended (its ``wait`` gives the real outcome) if it ended while no agent watched, or None
when nothing is known of it (the scheduler then requeues it as lost). The process runtime records the
outcome in ``LaunchSpec.exit_path`` through the exit wrapper (``exit_wrapper.c`` compiled, else
``exit_wrapper.py``: ``gpuquota.node_agent.native_wrapper``); another runtime may use its own record
(a container's exit code, say) the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuquota.node_agent import children, instances, native_wrapper, procs
from gpuquota.node_agent.instances import Instance
from gpuquota.node_agent.launch import AdoptRecord, AttemptHandle, LaunchError, LaunchSpec, Outcome, Trace

# ----- process runtime -----------------------------------------------------------------------------


class ProcessHandle:
    """A process group: our child (``proc``) or one adopted from a previous agent (polled)."""

    def __init__(
        self,
        pid: int,
        proc: subprocess.Popen[bytes] | None = None,
        start_time: int | None = None,
        poll_seconds: float = 0.05,
        exit_path: str | None = None,
    ) -> None:
        self.pid: int | None = pid
        self.pgid: int | None = pid  # start_new_session: the child leads its own group
        self.start_time = start_time
        self._proc = proc
        self._poll = poll_seconds
        self._exit_path = exit_path

    async def wait(self) -> Outcome:
        assert self.pid is not None and self.pgid is not None
        if self._proc is not None:
            rc = await children.exited(self._proc, self._poll)
            return Outcome(exit_code=None, signal=-rc) if rc < 0 else Outcome(exit_code=rc)
        # adopted: not our child; wait for the whole group to go, then read what the wrapper wrote
        while procs.group_alive(self.pgid):
            await asyncio.sleep(self._poll)
        return read_exit(self._exit_path) or Outcome(exit_code=None, reason="exit status unknown")

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
            await children.exited(self._proc, self._poll)


class NoProcess:
    """Base of the handles of attempts with no process of their own (ended before a restart, simulated):
    no process to name, nothing to stop or reap."""

    pid: int | None = None
    pgid: int | None = None
    start_time: int | None = None

    async def stop(self, grace: float, trace: Trace) -> None:
        return None

    async def reap(self) -> None:
        return None


@dataclass
class EndedHandle(NoProcess):
    """An attempt that ended while no agent watched it: ``wait`` gives its recorded outcome."""

    outcome: Outcome

    async def wait(self) -> Outcome:
        return self.outcome


def read_exit(path: str | Path | None) -> Outcome | None:
    """The outcome the exit wrapper recorded at ``path``; None if there is none (or it is unreadable)."""
    if path is None:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(doc, dict) and isinstance(doc.get("signal"), int):
        return Outcome(exit_code=None, signal=doc["signal"])
    if isinstance(doc, dict) and isinstance(doc.get("exit_code"), int):
        return Outcome(exit_code=doc["exit_code"])
    return None


def _check_command(argv: tuple[str, ...], env: dict[str, str], cwd: Path) -> None:
    """The launch errors a direct exec would raise, checked before the wrapper starts."""
    program = argv[0]
    if os.sep in program:
        path = Path(program) if os.path.isabs(program) else cwd / program
        if not path.exists():
            raise LaunchError(f"Cannot start the attempt: command not found: {program}")
        if not os.access(path, os.X_OK) or path.is_dir():
            raise LaunchError(f"Cannot start the attempt: permission denied: {program}")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise LaunchError(f"Cannot start the attempt: command not found: {program}")


RUN_IN = "run it on a node agent with --runtime container (docs/sagemaker-sdk.md)"


def container_paths(argv: Sequence[str]) -> str | None:
    """The first path of a SageMaker container (``/opt/ml/...``) that the command names and this
    machine lacks (the SDK's ``sm_drivers`` command hard-codes them), or ``None``."""
    for word in argv:
        for token in word.replace("&&", " ").replace(";", " ").split():
            if token.startswith("/opt/ml/") and not os.path.exists(token):
                return token
    return None


class ProcessRuntime:
    """Runs the payload's command as a local process in its own process group (session), through
    the exit wrapper when the spec has an ``exit_path``. ``exit_wrapper``: the wrapper's command
    (default: the compiled one when built, else the Python one; ``native_wrapper.command``)."""

    name = "process"

    def __init__(
        self,
        poll_seconds: float = 0.05,
        inherit_env: bool = True,
        exit_wrapper: tuple[str, ...] | None = None,
    ) -> None:
        self._poll = poll_seconds
        self._inherit_env = inherit_env
        self.exit_wrapper = exit_wrapper or native_wrapper.command()

    async def launch(self, spec: LaunchSpec) -> AttemptHandle:
        argv = spec.request.command
        if not argv:  # the process runtime does not run the TrainingImage's own entrypoint
            raise LaunchError(
                f"No command to run: the payload has no ContainerEntrypoint; give a SourceCode, or {RUN_IN}"
            )
        if fixed := container_paths(argv):
            raise LaunchError(
                f"The command uses {fixed}, a SageMaker container path the process runtime lacks: {RUN_IN}"
            )
        local = instances.local_instances(spec)
        if spec.peers:  # the instances on other nodes reach rank 0 at its node's address
            master, port = instances.master_address(spec), instances.gang_port(spec.attempt_id)
        else:
            master, port = "localhost", instances.free_port() if len(local) > 1 else 0
        handles: list[AttemptHandle] = []
        loop = asyncio.get_running_loop()
        try:
            for index, instance in enumerate(local):
                # off the loop: the directories, checks and spawn are system calls that, on a busy
                # machine, took about 40 % of the loop's time at 100 starts a second; on threads of
                # their own: a wave of launches in the loop's default executor held up the other work
                # queued there (the embedded scheduler's log appends, the agent's state.json writes)
                start = functools.partial(self._start, spec, instance, index, master, port)
                in_context = functools.partial(contextvars.copy_context().run, start)
                handles.append(await loop.run_in_executor(children.launcher(), in_context))
        except BaseException:
            for handle in handles:
                await handle.reap()
            raise
        if len(handles) == 1 and not spec.peers:
            return handles[0]
        return instances.GroupHandle(handles, [i.host for i in local])

    def _start(
        self, spec: LaunchSpec, instance: Instance, index: int, master: str, port: int
    ) -> ProcessHandle:
        """Instance ``index``'s process (its directories made first); blocks: runs on a worker thread."""
        env = {**spec.env, **instances.instance_env(spec, instance, master, port)}
        env |= instances.output_env(spec, instance)
        log = spec.log_path
        if index > 0:
            log = log.with_name(f"{log.stem}.{instance.host}{log.suffix}")
        exit_file = member_exit_path(
            None if spec.exit_path is None else str(spec.exit_path), instance.host, index
        )
        cwd, note = instances.working_dir(spec, instance)
        return self._spawn(spec.request.command, env, log, cwd, exit_file, note)

    def _spawn(
        self,
        argv: tuple[str, ...],
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        exit_file: str | None,
        note: str | None = None,
    ) -> ProcessHandle:
        """One instance's process, behind the exit wrapper when its exit status is to be recorded;
        ``note``: a first line for its log (where it runs, when not where it was asked to)."""
        env = {**os.environ, **env} if self._inherit_env else env
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if exit_file is not None:
            _check_command(argv, env, cwd)
            Path(exit_file).parent.mkdir(parents=True, exist_ok=True)
            argv = (*self.exit_wrapper, exit_file, *argv)
        try:
            with open(log_path, "ab") as log:
                if note is not None:
                    log.write(f"{note}\n".encode())
                    log.flush()
                proc = children.start(argv, log, env, cwd)
        except FileNotFoundError:
            raise LaunchError(f"Cannot start the attempt: command not found: {argv[0]}") from None
        except PermissionError:
            raise LaunchError(f"Cannot start the attempt: permission denied: {argv[0]}") from None
        except OSError as exc:
            raise LaunchError(f"Cannot start the attempt: {argv[0]}: {exc.strerror or exc}") from None
        return ProcessHandle(proc.pid, proc, procs.start_time(proc.pid), self._poll, exit_file)

    def adopt(self, record: AdoptRecord) -> AttemptHandle | None:
        if record.runtime != self.name:
            return None
        if len(record.members) > 1:
            return self._adopt_group(record)
        return self._adopt_one(record.pid, record.start_time, record.exit_path)

    def _adopt_one(
        self, pid: int | None, start_time: int | None, exit_file: str | None
    ) -> AttemptHandle | None:
        """A handle on a still running instance, or on how it ended (its exit file); None: unknown."""
        if pid is None and exit_file is not None:
            pid = wrapper_pid(exit_file)  # the agent died between the launch and its record
            start_time = None if pid is None else procs.start_time(pid)
        if pid is not None and self._still_runs(pid, start_time):
            return ProcessHandle(pid, None, start_time, self._poll, exit_file)
        outcome = read_exit(exit_file)
        return None if outcome is None else EndedHandle(outcome)

    @staticmethod
    def _still_runs(pid: int, start_time: int | None) -> bool:
        """The group led by ``pid`` still runs (and ``pid`` was not reused by someone else)."""
        if procs.pid_alive(pid, start_time):
            return True
        return not procs.pid_alive(pid) and procs.group_alive(pid)

    def _adopt_group(self, record: AdoptRecord) -> AttemptHandle | None:
        hosts = [instances.host_name(record.first_rank + i) for i in range(len(record.members))]
        members = [
            self._adopt_one(pid, started, member_exit_path(record.exit_path, hosts[index], index))
            for index, (pid, started) in enumerate(record.members)
        ]
        if all(m is None for m in members):
            return None
        # a member whose end is unknown fails the group, which stops the others
        handles: list[AttemptHandle] = [m or _Gone() for m in members]
        return instances.GroupHandle(handles, hosts)


def member_exit_path(exit_file: str | None, host: str, index: int) -> str | None:
    """The exit file of the node's instance ``index``: the attempt's own for its first, one beside it
    for the others."""
    if exit_file is None or index == 0:
        return exit_file
    path = Path(exit_file)
    return str(path.with_name(f"{path.stem}.{host}{path.suffix}"))


class _Gone(NoProcess):
    """An instance that had already ended when the agent restarted (exit status unknown)."""

    async def wait(self) -> Outcome:
        return Outcome(exit_code=None, reason="exit status unknown (ended while the node agent was down)")


def wrapper_pid(exit_path: str) -> int | None:
    """The exit wrapper's pid, from the ``{"pid": N}`` record it writes to its exit file first (or
    from ``EXIT_FILE.pid``, where wrappers before session 7 wrote it); None: none was written."""
    try:
        doc = json.loads(Path(exit_path).read_text())
        if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
            return int(doc["pid"])
    except (OSError, ValueError):
        pass
    try:
        return int(Path(f"{exit_path}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


# ----- simulated runtime ---------------------------------------------------------------------------

SIM_DURATION = "GPUQUOTA_SIM_DURATION_SECONDS"
SIM_EXIT_CODE = "GPUQUOTA_SIM_EXIT_CODE"


@dataclass
class SimulatedHandle(NoProcess):
    duration: float
    exit_code: int
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
        exit_path=record.get("exit_path"),
        node_id=str(command.get("node_id", "")),
        job_id=str(command.get("job_id", "")),
        attempt_id=str(command.get("attempt_id", "")),
        members=tuple((m[0], m[1]) for m in record.get("members") or () if m),
        first_rank=_first_rank(command),
    )


def _first_rank(command: dict[str, Any]) -> int:
    """The rank of the node's first instance, from the recorded ``RunAttempt``'s gang."""
    for node in command.get("gang") or ():
        if isinstance(node, dict) and node.get("node_id") == command.get("node_id"):
            return int(node.get("first_rank", 0))
    return 0
