"""The node agent: registers a node, runs the attempts the scheduler places on it, reports them.

Everything it sends goes through an ordered outbox: an input whose ``send`` raises stays at the head
and is re-sent (with back-off) before anything later, so reports arrive in order and none is lost
while the agent runs (the scheduler treats reports idempotently). Heartbeats bypass the outbox: they
are sent on time even while the outbox is busy (a node reporting a stream of short attempts must not
look dead to the scheduler, which counts only heartbeats), but not before the ``RegisterNode`` went
out, not after the ``DeregisterNode``, and not while the outbox is retrying a failed send (the link
is down: they are dropped).

Lost while alive: when the scheduler declared the node lost (its heartbeats did not arrive in time:
a partition, a long pause) or does not know it, it answers a heartbeat with ``InputRejected`` and sends
``RegisterAgain``. The agent then sends its ``RegisterNode`` again (its slots, as at start), re-reports
the attempts it still runs, as after a restart (the scheduler requeued them when it lost the node, so
it fences them: ``StopAttempt``), and repeats its ``DrainNode`` if it drains. Repeated ``RegisterAgain``
commands are harmless: one while a ``RegisterNode`` still waits in the outbox is ignored, and the
scheduler takes registrations and reports idempotently.

Restart: running attempts are recorded in ``work_dir/state.json`` (attempt, pid, pgid, process start
time). A new agent for the same node adopts the process groups still alive: it reports them RUNNING
again (so a scheduler that no longer assigns them answers with a ``StopAttempt``: fencing) and polls
them. An adopted attempt is not our child, so its exit status is unknown: when it ends by itself it is
reported FAILED ``Attempt lost: the node agent restarted while it ran (exit status unknown)``, and the
scheduler's retry policy decides. Attempts whose processes are gone at restart are reported FAILED the
same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuquota.core.lifecycle import algorithm_error
from gpuquota.node_agent.payload import BadPayload, TrainingRequest, hyperparameter_env, parse_payload
from gpuquota.node_agent.runtime import AttemptHandle, LaunchError, LaunchSpec, Outcome, Runtime, describe
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import (
    AttemptReport,
    AttemptStatus,
    DeregisterNode,
    DrainNode,
    NodeHeartbeat,
    RegisterNode,
    SchedulerInput,
)
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt, StopAttempt

log = logging.getLogger(__name__)

Send = Callable[[SchedulerInput], Awaitable[object]]

LOST_REASON = "Attempt lost: the node agent restarted while it ran (exit status unknown)"
STATE_FILE = "state.json"
_KEEP_FINISHED = 10_000


def _safe(name: str) -> str:
    """A file-name-safe form of an id."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Attempt:
    command: RunAttempt
    handle: AttemptHandle | None = None
    stop_reason: str | None = None
    stop_task: asyncio.Task[None] | None = None
    timed_out: bool = False
    exited: bool = False
    adopted: bool = False
    started_at: float = field(default_factory=time.time)
    max_runtime: float | None = None
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


class NodeAgent:
    def __init__(
        self,
        node_id: str,
        pool: str,
        slots: tuple[SlotOffer, ...],
        runtime: Runtime,
        send: Send,
        work_dir: Path,
        heartbeat_seconds: float = 5.0,
        preemption_grace: float = 30.0,
        *,
        retry_seconds: float = 0.1,
        max_retry_seconds: float = 5.0,
    ) -> None:
        self.node_id = node_id
        self.pool = pool
        self.slots = slots
        self.runtime = runtime
        self.work_dir = Path(work_dir)
        self.heartbeat_seconds = heartbeat_seconds
        self.preemption_grace = preemption_grace
        self._send = send
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._attempts: dict[str, _Attempt] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._outbox: deque[SchedulerInput] = deque()
        self._wake = asyncio.Event()
        self._sending = False
        self._registered = False
        """The RegisterNode was sent and no DeregisterNode yet: heartbeats may go out."""
        self._link_down = False
        """The outbox's last send failed; cleared by the next one that succeeds."""
        self._draining = False
        """``drain`` began: a repeated registration repeats the DrainNode."""
        self._leaving = False
        """``drain`` emitted the DeregisterNode: RegisterAgain is ignored."""
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.registrations = 0
        """RegisterNode inputs emitted (the first at start, one per accepted RegisterAgain)."""
        self.send_failures = 0
        self.trace: list[tuple[float, str, str]] = []
        """(epoch seconds, attempt id, what happened): signals, group gone, reports; for timelines."""

    # ----- lifecycle ------------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    @property
    def active_attempts(self) -> list[str]:
        return [a for a, att in self._attempts.items() if not att.done.is_set()]

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._registered = False
        for sub in ("logs", "checkpoints"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        self._register()
        self._recover()
        self._tasks.append(asyncio.create_task(self._sender(), name=f"agent-{self.node_id}-outbox"))
        self._tasks.append(asyncio.create_task(self._heartbeats(), name=f"agent-{self.node_id}-heartbeat"))

    async def drain(self, timeout: float | None = None) -> None:
        """DrainNode; wait for the attempts to end (at most ``timeout`` s, then stop them: STOPPED);
        DeregisterNode; flush the outbox; stop."""
        self._draining = True
        self._emit(DrainNode(**self._meta(), node_id=self.node_id))
        pending = [a.done.wait() for a in self._attempts.values() if not a.done.is_set()]
        if pending:
            _, late = await asyncio.wait([asyncio.ensure_future(p) for p in pending], timeout=timeout)
            for fut in late:
                fut.cancel()
        for att in list(self._attempts.values()):
            if not att.done.is_set():
                self._request_stop(att, f"Node {self.node_id} drained: attempt handed back")
        for att in list(self._attempts.values()):
            await att.done.wait()
        self._leaving = True
        self._emit(DeregisterNode(**self._meta(), node_id=self.node_id))
        await self.flush()
        await self.stop()

    async def stop(self, flush_timeout: float = 1.0) -> None:
        """Stops the agent. Running processes are left alone (recorded for the next agent to adopt)."""
        with contextlib.suppress(TimeoutError):
            await self.flush(flush_timeout)
        tasks = self._tasks + [a.task for a in self._attempts.values() if a.task is not None]
        self._tasks = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._started = False

    async def flush(self, timeout: float | None = None) -> None:
        """Waits until the outbox is empty (raises TimeoutError after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outbox or self._sending:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("outbox not flushed")
            await asyncio.sleep(0.01)

    async def wait_idle(self) -> None:
        """Waits until no attempt is running."""
        for att in list(self._attempts.values()):
            await att.done.wait()

    # ----- commands -------------------------------------------------------------------------------

    async def deliver(self, command: NodeCommand) -> None:
        if command.node_id != self.node_id:
            log.warning("ignoring %s for node %s (this is %s)", command.type, command.node_id, self.node_id)
            return
        if isinstance(command, RunAttempt):
            if command.attempt_id in self._attempts or command.attempt_id in self._finished:
                log.info("ignoring repeated RunAttempt %s", command.attempt_id)
                return
            att = _Attempt(command=command)
            self._attempts[command.attempt_id] = att
            att.task = asyncio.create_task(self._run(att), name=f"attempt-{command.attempt_id}")
        elif isinstance(command, StopAttempt):
            stopping = self._attempts.get(command.attempt_id)
            if stopping is None or stopping.done.is_set():
                log.info("ignoring StopAttempt for unknown or finished attempt %s", command.attempt_id)
                return
            self._request_stop(stopping, command.reason)
        elif isinstance(command, RegisterAgain):
            self._register_again(command.reason)

    def _register(self) -> None:
        self.registrations += 1
        self._emit(RegisterNode(**self._meta(), node_id=self.node_id, pool=self.pool, slots=self.slots))

    def _register_again(self, reason: str) -> None:
        """The scheduler does not count the node as registered (lost, or unknown): register again and
        re-report the attempts still running, so the scheduler fences those it no longer assigns."""
        if not self._started or self._leaving:
            log.info("ignoring RegisterAgain (%s): the agent is not running or deregisters", reason)
            return
        if any(isinstance(m, RegisterNode) for m in self._outbox):
            log.info("ignoring RegisterAgain (%s): a RegisterNode is on its way", reason)
            return
        log.warning("node %s registers again: %s", self.node_id, reason)
        self._register()
        for att in list(self._attempts.values()):
            if att.done.is_set() or att.stop_reason is not None or att.exited:
                continue  # over, or about to report STOPPED
            self._report(att, "RUNNING" if att.handle is not None else "STARTING")
        if self._draining:
            self._emit(DrainNode(**self._meta(), node_id=self.node_id))

    def _request_stop(self, att: _Attempt, reason: str) -> None:
        if att.stop_reason is not None or att.exited:
            return
        att.stop_reason = reason
        self._start_stop(att)

    def _start_stop(self, att: _Attempt) -> None:
        if att.handle is not None and att.stop_task is None:
            aid = att.command.attempt_id
            att.stop_task = asyncio.create_task(
                att.handle.stop(self.preemption_grace, lambda what: self._note(aid, what))
            )

    # ----- running one attempt --------------------------------------------------------------------

    async def _run(self, att: _Attempt) -> None:
        cmd = att.command
        try:
            self._report(att, "STARTING")
            try:
                spec = self._prepare(cmd)
                att.max_runtime = spec.request.max_runtime_seconds
                if att.stop_reason is not None:
                    self._report(att, "STOPPED", reason=att.stop_reason)
                    return
                att.handle = await self.runtime.launch(spec)
            except (BadPayload, LaunchError) as exc:
                self._report(att, "FAILED", reason=str(exc))
                return
            att.started_at = time.time()
            self._note(cmd.attempt_id, f"launched (pid {att.handle.pid})")
            self._save_state()
            if att.stop_reason is not None:
                self._start_stop(att)
            else:
                self._report(att, "RUNNING")
            await self._supervise(att)
        except asyncio.CancelledError:
            raise  # the agent stops; the process keeps running and stays in state.json
        except Exception as exc:  # never let one attempt take the agent down
            log.exception("attempt %s failed in the agent", cmd.attempt_id)
            if not att.done.is_set():
                self._report(att, "FAILED", reason=f"Node agent error: {exc}")
        self._finish(att)

    async def _supervise(self, att: _Attempt) -> None:
        handle = att.handle
        assert handle is not None
        waiter = asyncio.ensure_future(handle.wait())
        try:
            if att.max_runtime is not None:
                left = att.max_runtime - (time.time() - att.started_at)
                done, _ = await asyncio.wait({waiter}, timeout=max(0.0, left))
                if not done and att.stop_reason is None:
                    att.timed_out = True
                    self._note(att.command.attempt_id, f"MaxRuntimeInSeconds ({att.max_runtime:g}) exceeded")
                    self._start_stop(att)
            outcome = await waiter
        finally:
            waiter.cancel()
        att.exited = att.stop_task is None
        if att.stop_task is not None:
            await att.stop_task  # the whole process group is gone once this returns
        else:
            await handle.reap()
        self._report_outcome(att, outcome)

    def _report_outcome(self, att: _Attempt, outcome: Outcome) -> None:
        if att.stop_reason is not None:
            self._report(att, "STOPPED", reason=att.stop_reason, exit_code=_exit_code(outcome))
        elif att.timed_out:
            reason = f"Attempt exceeded StoppingCondition.MaxRuntimeInSeconds ({att.max_runtime:g} s)"
            self._report(att, "FAILED", reason=reason, exit_code=_exit_code(outcome))
        elif outcome.exit_code == 0:
            self._report(att, "SUCCEEDED", exit_code=0)
        elif outcome.signal is not None:
            name = _signal_name(outcome.signal)
            self._report(
                att,
                "FAILED",
                reason=algorithm_error(f"killed by signal {name}"),
                exit_code=_exit_code(outcome),
            )
        elif outcome.exit_code is not None:
            reason = algorithm_error(f"exited with code {outcome.exit_code}")
            self._report(att, "FAILED", reason=reason, exit_code=outcome.exit_code)
        else:
            self._report(att, "FAILED", reason=LOST_REASON if att.adopted else "Attempt lost")

    def _finish(self, att: _Attempt) -> None:
        aid = att.command.attempt_id
        att.done.set()
        self._attempts.pop(aid, None)
        self._finished[aid] = None
        while len(self._finished) > _KEEP_FINISHED:
            self._finished.popitem(last=False)
        self._save_state()

    def _prepare(self, cmd: RunAttempt) -> LaunchSpec:
        offered = sorted({s.unit for s in self.slots})
        request = parse_payload(cmd.payload)
        for unit in filter(None, (cmd.unit, request.instance_type)):
            if unit not in offered:
                offers = ", ".join(offered) or "nothing"
                node = self.node_id
                raise BadPayload(f"Instance type {unit} is not offered by node {node} (offers: {offers})")
        for index in cmd.slots:
            if not 0 <= index < len(self.slots) or self.slots[index].unit != cmd.unit:
                raise BadPayload(f"Node {self.node_id} has no {cmd.unit} slot {index}")
        gpus = cmd.gpus or tuple(g for i in cmd.slots for g in self.slots[i].gpus)
        checkpoint = self._checkpoint_dir(cmd, request)
        env = {
            **request.environment,
            **hyperparameter_env(request.hyperparameters),
            "SM_HPS": json.dumps(request.hyperparameters, sort_keys=True),
            "SM_CURRENT_INSTANCE_TYPE": cmd.unit,
            "SM_NUM_GPUS": str(len(gpus)),
            "SM_CHECKPOINT_DIR": str(checkpoint),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
            "GPUQUOTA_JOB_ID": cmd.job_id,
            "GPUQUOTA_JOB_NAME": cmd.job_name,
            "GPUQUOTA_ATTEMPT": str(cmd.attempt_number),
            "GPUQUOTA_ATTEMPT_ID": cmd.attempt_id,
            "GPUQUOTA_NODE_ID": self.node_id,
        }
        return LaunchSpec(
            job_id=cmd.job_id,
            attempt_id=cmd.attempt_id,
            request=request,
            env=env,
            log_path=self.work_dir / "logs" / f"{_safe(cmd.attempt_id)}.log",
            cwd=self.work_dir,
        )

    def _checkpoint_dir(self, cmd: RunAttempt, request: TrainingRequest) -> Path:
        if request.checkpoint_local_path:
            path = self.work_dir / request.checkpoint_local_path  # an absolute LocalPath wins
        else:
            path = self.work_dir / "checkpoints" / _safe(cmd.job_id)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadPayload(
                f"Checkpoint directory {path} cannot be created: {exc.strerror or exc}"
            ) from None
        if not path.is_dir() or not os.access(path, os.R_OK | os.W_OK | os.X_OK):
            raise BadPayload(f"Checkpoint directory {path} is not readable and writable")
        return path

    # ----- restart --------------------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("ignoring unreadable %s: %s", self.state_path, exc)
            return {}
        return doc if isinstance(doc, dict) else {}

    def _recover(self) -> None:
        doc = self._load_state()
        if doc.get("node_id") not in (None, self.node_id):
            log.warning("%s belongs to node %s; ignoring it", self.state_path, doc.get("node_id"))
            return
        for aid, record in dict(doc.get("attempts") or {}).items():
            try:
                cmd = RunAttempt.model_validate(record["command"])
            except Exception as exc:
                log.error("ignoring unreadable attempt record %s: %s", aid, exc)
                continue
            att = _Attempt(command=cmd, adopted=True, started_at=float(record.get("started_at", time.time())))
            self._attempts[aid] = att
            handle = self.runtime.adopt(describe(record))
            if handle is None:
                self._note(aid, "lost at restart")
                self._report(att, "FAILED", reason=LOST_REASON)
                self._finish(att)
                continue
            att.handle = handle
            with contextlib.suppress(BadPayload):
                att.max_runtime = parse_payload(cmd.payload).max_runtime_seconds
            self._note(aid, f"adopted (pid {handle.pid})")
            self._report(att, "RUNNING")  # fencing: the scheduler stops it if it is no longer assigned
            att.task = asyncio.create_task(self._watch(att), name=f"adopted-{aid}")
        self._save_state()

    async def _watch(self, att: _Attempt) -> None:
        try:
            await self._supervise(att)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("adopted attempt %s", att.command.attempt_id)
            self._report(att, "FAILED", reason=f"Node agent error: {exc}")
        self._finish(att)

    def _save_state(self) -> None:
        attempts = {
            aid: {
                "command": att.command.model_dump(mode="json"),
                "runtime": self.runtime.name,
                "pid": att.handle.pid,
                "pgid": att.handle.pgid,
                "start_time": att.handle.start_time,
                "started_at": att.started_at,
            }
            for aid, att in self._attempts.items()
            if att.handle is not None and not att.done.is_set()
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"node_id": self.node_id, "attempts": attempts}, indent=2))
        os.replace(tmp, self.state_path)

    # ----- sending --------------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {"event_id": str(uuid.uuid4()), "occurred_at": _now_ms()}

    def _note(self, attempt_id: str, what: str) -> None:
        self.trace.append((time.time(), attempt_id, what))
        log.info("attempt %s: %s", attempt_id, what)

    def _report(
        self, att: _Attempt, status: AttemptStatus, reason: str | None = None, exit_code: int | None = None
    ) -> None:
        cmd = att.command
        self._note(cmd.attempt_id, f"report {status}" + (f": {reason}" if reason else ""))
        self._emit(
            AttemptReport(
                **self._meta(),
                node_id=self.node_id,
                job_id=cmd.job_id,
                attempt_id=cmd.attempt_id,
                status=status,
                exit_code=exit_code,
                status_reason=reason[:1024] if reason else None,
            )
        )

    def _emit(self, message: SchedulerInput) -> None:
        self._outbox.append(message)
        self._wake.set()

    async def _sender(self) -> None:
        delay = self._retry
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                self._sending = True
                try:
                    await self._send(self._outbox[0])
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.send_failures += 1
                    self._link_down = True
                    log.warning("send failed (%s); retrying in %.2f s", exc, delay)
                    await asyncio.sleep(delay)  # back-off before the retry
                    delay = min(delay * 2, self._max_retry)
                    continue
                finally:
                    self._sending = False
                sent = self._outbox.popleft()
                self._link_down = False
                if isinstance(sent, RegisterNode | DeregisterNode):
                    self._registered = isinstance(sent, RegisterNode)
                delay = self._retry

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)  # the heartbeat period
            if not self._registered or self._link_down:
                continue  # not registered yet (or any more), or the outbox is retrying a failed send
            try:
                await self._send(NodeHeartbeat(**self._meta(), node_id=self.node_id))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat not sent: %s", exc)


def _exit_code(outcome: Outcome) -> int | None:
    if outcome.signal is not None:
        return 128 + outcome.signal
    return outcome.exit_code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
