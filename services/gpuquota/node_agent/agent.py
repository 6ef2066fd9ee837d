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
``RegisterAgain``. The agent then sends its ``RegisterNode`` again (its slots and the attempts it
runs, which the scheduler requeued when it lost the node, so it fences them: ``StopAttempt``), and
repeats its ``DrainNode`` if it drains. Repeated ``RegisterAgain``
commands are harmless: one while a ``RegisterNode`` still waits in the outbox is ignored, and the
scheduler takes registrations and reports idempotently.

Restart (``records.py``): an attempt is recorded before it is launched and forgotten only once the
send of its final report succeeded. A new agent for the node reports again the final reports not
delivered, adopts the attempts still running and reports those that ended meanwhile by the exit
status the runtime recorded; it forgets unreported an attempt of which nothing is left (the
scheduler, whose log assigns it, requeues it as lost: S5.7). The registration and each heartbeat
list the attempts the agent knows; the scheduler reconciles them with its log (docs/semantics.md).

Incarnations: each registration draws a new random ``incarnation`` and the scheduler addresses every
``RunAttempt`` to the incarnation its node had when it dispatched the attempt. The agent drops one
addressed to another incarnation: it was dispatched before the agent's latest registration, which did
not list it, so the scheduler has requeued it already (``core.nodes``). This is what keeps a restarted
agent, whose command feed resumes at its last committed offset, from running again the commands the
dead agent had received but not recorded, or never received, while their jobs run elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

from gpuquota.core.policy import DEFAULT_POLICY
from gpuquota.node_agent.checkpoint_watch import refresh
from gpuquota.node_agent.outcomes import FinalStatus, final_status
from gpuquota.node_agent.payload import BadPayload, parse_payload
from gpuquota.node_agent.prepare import attempt_outputs, exit_path, prepared_and_recorded
from gpuquota.node_agent.records import KEEP_FINISHED, STATE_FILE, Attempt, AttemptBook, AttemptPhase
from gpuquota.node_agent.runtime import LaunchError, Runtime, describe
from gpuquota.node_agent.s3_stage import DataPlane
from gpuquota.node_agent.saving import StateSaver
from gpuquota.node_agent.sending import LOST_REASON, Send, SendMany, head_batch
from gpuquota.observe.logs import bind
from gpuquota.support.dirlock import DirectoryLock
from gpuquota.support.ids import uuid4, uuid7
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import (
    AttemptReport,
    AttemptStatus,
    DeregisterNode,
    DrainNode,
    NodeAttempt,
    NodeHeartbeat,
    RegisterNode,
    SchedulerInput,
)
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt, StopAttempt

log = logging.getLogger(__name__)

FINAL = ("SUCCEEDED", "FAILED", "STOPPED")
__all__ = ["LOST_REASON", "STATE_FILE", "NodeAgent", "Send"]


def _now_ms() -> int:
    return int(time.time() * 1000)


class NodeAgent:
    def __init__(
        self,
        node_id: str,
        pool: str,
        slots: tuple[SlotOffer, ...],
        runtime: Runtime,
        send: Send,
        work_dir: Path,
        heartbeat_seconds: float = DEFAULT_POLICY.heartbeat_seconds,
        preemption_grace: float = DEFAULT_POLICY.preemption_grace_seconds,
        *,
        retry_seconds: float = 0.1,
        max_retry_seconds: float = 5.0,
        address: str = "",
        send_many: SendMany | None = None,
        data: DataPlane | None = None,
    ) -> None:
        self.node_id = node_id
        self.data = data if data is not None and runtime.name != "simulated" else DataPlane(None)
        """S3: channels in, checkpoints and artifacts out (``s3_stage``); without a store, none."""
        self.address = address  # how other nodes reach this one (empty: by its node id)
        self.pool = pool
        self.slots = slots
        self.runtime = runtime
        self.work_dir = Path(work_dir).absolute()
        self.book = AttemptBook(self.work_dir, node_id)
        self.lock = DirectoryLock(self.work_dir)
        self.heartbeat_seconds = heartbeat_seconds
        self.preemption_grace = preemption_grace
        self._send = send
        self._send_many = send_many
        self._saver = StateSaver(self.book, self._records)
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._attempts: dict[str, Attempt] = {}
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
        self._closing = False
        """``stop_attempts`` began: no RunAttempt is launched any more."""
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.registrations = 0
        """RegisterNode inputs emitted (the first at start, one per accepted RegisterAgain)."""
        self.incarnation: str | None = None
        """The latest registration's ``RegisterNode.incarnation`` (none before the first)."""
        self.stale_commands = 0
        """RunAttempt commands dropped: addressed to an earlier registration (module doc)."""
        self.send_failures = 0
        self.trace: list[tuple[float, str, str]] = []
        """(epoch seconds, attempt id, what happened): signals, group gone, reports; for timelines."""

    # ----- lifecycle ------------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.book.state_path

    @property
    def active_attempts(self) -> list[str]:
        return [a for a, att in self._attempts.items() if not att.done.is_set()]

    @property
    def connected(self) -> bool:
        """Registered with the scheduler, and the last send to it succeeded (``/health/ready``)."""
        return self._registered and not self._link_down

    async def start(self) -> None:
        if self._started:
            return
        self.lock.acquire()  # DirectoryInUse: another agent works here
        self._started = True
        self._registered = False
        for sub in ("logs", "checkpoints", "exits"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        self._recover()
        self._register()
        for att in list(self._attempts.values()):
            if att.final is not None:
                self._emit(att.final)  # its delivery was not confirmed before the restart
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

    async def stop_attempts(self, reason: str) -> None:
        """Stops every attempt for good, as a stack that goes away does (``gpuquota up`` without
        ``--leave-running``): SIGTERM, the preemption grace, SIGKILL, each reported STOPPED with
        ``reason`` (the scheduler requeues its job); returns once all have ended. From then on a
        RunAttempt is dropped, not launched: the next registration does not list it, so the
        scheduler requeues it (incarnations, above)."""
        self._closing = True
        for att in list(self._attempts.values()):
            if not att.done.is_set():
                self._request_stop(att, reason)
        await self.wait_idle()

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
        if self._started:  # never over the records of the agent whose lock made start() fail
            await self._saver.close()
        self._started = False
        self.lock.release()

    async def flush(self, timeout: float | None = None) -> None:
        """Waits until the outbox is empty (raises TimeoutError after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outbox or self._sending:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("outbox not flushed")
            await asyncio.sleep(0.01)
        await self._saver.flush()  # what was delivered is on disk too

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
            if self._closing:
                log.warning(
                    "dropping RunAttempt %s: the node's attempts are being stopped", command.attempt_id
                )
                return
            if command.incarnation and command.incarnation != self.incarnation:
                self.stale_commands += 1
                log.warning(
                    "dropping RunAttempt %s: dispatched to incarnation %s, before this registration (%s),"
                    " which the scheduler reconciled without it",
                    command.attempt_id,
                    command.incarnation,
                    self.incarnation,
                )
                return
            att = Attempt(command=command)
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
        """A new incarnation and the attempts it knows, taken together: a ``RunAttempt`` for an earlier
        incarnation that is not among them is requeued by the scheduler, and dropped here."""
        self.registrations += 1
        self.incarnation = uuid4()
        node = {"node_id": self.node_id, "pool": self.pool, "slots": self.slots, "address": self.address}
        self._emit(RegisterNode(**self._meta(), **node, attempts=self._known(), incarnation=self.incarnation))

    def _known(self) -> tuple[NodeAttempt, ...]:
        return tuple(att.known() for att in self._attempts.values())

    def _register_again(self, reason: str) -> None:
        """The scheduler does not count the node as registered (lost, or unknown): register again,
        listing the attempts still running, so the scheduler fences those it no longer assigns."""
        if not self._started or self._leaving:
            log.info("ignoring RegisterAgain (%s): the agent is not running or deregisters", reason)
            return
        if any(isinstance(m, RegisterNode) for m in self._outbox):
            log.info("ignoring RegisterAgain (%s): a RegisterNode is on its way", reason)
            return
        log.warning("node %s registers again: %s", self.node_id, reason)
        self._register()  # it lists the attempts the agent runs: the scheduler fences them
        if self._draining:
            self._emit(DrainNode(**self._meta(), node_id=self.node_id))

    def _request_stop(self, att: Attempt, reason: str) -> None:
        if not att.stoppable:
            return
        att.stop_reason = reason
        att.move(AttemptPhase.STOP_REQUESTED)
        self._start_stop(att)

    def _start_stop(self, att: Attempt) -> None:
        if att.handle is not None and att.stop_task is None:
            aid = att.command.attempt_id
            att.stop_task = asyncio.create_task(
                att.handle.stop(self.preemption_grace, lambda what: self._note(aid, what))
            )

    # ----- running one attempt --------------------------------------------------------------------

    async def _run(self, att: Attempt) -> None:
        cmd = att.command
        bind(node_id=self.node_id, job_id=cmd.job_id, attempt_id=cmd.attempt_id)  # every line of this task
        try:
            self._report(att, "STARTING")
            try:
                contained = getattr(self.runtime, "contained", False)
                spec = await prepared_and_recorded(
                    cmd, self.node_id, self.slots, self.work_dir, self._saver.durable, contained=contained
                )
                att.max_runtime = spec.request.max_runtime_seconds
                spec = await self.data.stage_in(spec)  # downloads: a stop request waits for them
                if att.stop_reason is not None:
                    self._report(att, "STOPPED", reason=att.stop_reason)
                    return
                att.handle = await self.runtime.launch(spec)
            except (BadPayload, LaunchError) as exc:
                self._report(att, "FAILED", reason=str(exc))
                return
            att.started_at = time.time()
            self._note(cmd.attempt_id, f"launched (pid {att.handle.pid})")
            self._saver.changed()
            if att.stop_reason is not None:
                self._start_stop(att)
            else:
                att.move(AttemptPhase.RUNNING)
                self._report(att, "RUNNING")
            await self._supervise(att)
        except asyncio.CancelledError:
            raise  # the agent stops; the process keeps running and stays in state.json
        except Exception as exc:  # never let one attempt take the agent down
            log.exception("attempt %s failed in the agent", cmd.attempt_id)
            if att.final is None:
                self._report(att, "FAILED", reason=f"Node agent error: {exc}")
        self._finish(att)

    async def _supervise(self, att: Attempt) -> None:
        handle = att.handle
        assert handle is not None
        cmd, contained = att.command, getattr(self.runtime, "contained", False)
        syncing = self.data.checkpoints(cmd, self.work_dir, contained)
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
            if syncing is not None:
                syncing.cancel()
        if att.stop_task is None:
            att.move(AttemptPhase.ENDED)  # by itself: a stop request comes too late
        if att.stop_task is not None:
            await att.stop_task  # the whole process group is gone once this returns
        else:
            await handle.reap()
        final = final_status(outcome, att.stop_reason, att.max_runtime if att.timed_out else None)
        # uploaded before the final report is recorded: a restarted agent uploads what is missing
        self._report_outcome(att, await self.data.stage_out(cmd, self.work_dir, contained, final))

    def _report_outcome(self, att: Attempt, final: FinalStatus | None) -> None:
        if final is not None:
            self._report(att, *final)
        elif att.adopted:
            # nothing says how it ended: forgotten unreported, so the scheduler requeues it as lost
            self._note(att.command.attempt_id, "ended with no exit status: lost")
            self._forget(att.command.attempt_id)
        else:
            self._report(att, "FAILED", reason="Attempt lost")

    def _finish(self, att: Attempt) -> None:
        """The attempt is over; it is forgotten once its final report is delivered (``_delivered``)."""
        att.done.set()
        if att.command.attempt_id in self._attempts:
            self._saver.changed()

    def _delivered(self, sent: SchedulerInput) -> None:
        self._link_down = False
        if isinstance(sent, RegisterNode | DeregisterNode):
            self._registered = isinstance(sent, RegisterNode)
        if isinstance(sent, AttemptReport) and sent.status in FINAL:
            att = self._attempts.get(sent.attempt_id)
            if att is not None and att.final is sent:
                self._forget(sent.attempt_id)

    def _forget(self, attempt_id: str) -> None:
        self._attempts.pop(attempt_id, None)
        self._finished[attempt_id] = None
        while len(self._finished) > KEEP_FINISHED:
            self._finished.popitem(last=False)
        self.book.add_finished(attempt_id)
        self._saver.changed()
        # its exit files stay, like its log: on ext4 without a journal each file made skips the inodes
        # freed in the last minutes, which made two deletions per attempt a large cost (benchmarks.md)

    # ----- restart --------------------------------------------------------------------------------

    def _recover(self) -> None:
        for aid in self.book.finished():
            self._finished[aid] = None
        for aid, record in self.book.load().items():
            try:
                cmd = RunAttempt.model_validate(record["command"])
                final = record.get("final")
                report = None if final is None else AttemptReport.model_validate(final)
            except Exception as exc:
                log.error("ignoring unreadable attempt record %s: %s", aid, exc)
                continue
            started = float(record.get("started_at", time.time()))
            att = Attempt(
                command=cmd, adopted=True, started_at=started, status=record.get("status", "RUNNING")
            )
            if report is not None:
                att.move(AttemptPhase.ENDED)
                att.final, att.status = report, report.status
                att.done.set()
                self._attempts[aid] = att
                continue
            handle = self.runtime.adopt(describe({"exit_path": str(exit_path(self.work_dir, aid)), **record}))
            if handle is None:
                self._note(aid, "lost at restart: no process, no exit status")
                self._forget(aid)
                continue
            self._attempts[aid] = att
            att.handle = handle
            att.move(AttemptPhase.RUNNING)
            with contextlib.suppress(BadPayload):
                att.max_runtime = parse_payload(cmd.payload).max_runtime_seconds
            self._note(aid, f"adopted (pid {handle.pid})")
            att.task = asyncio.create_task(self._watch(att), name=f"adopted-{aid}")
        sweep = getattr(self.runtime, "sweep", None)  # removes what a dead agent started but never recorded
        if sweep is not None:
            sweep(self.node_id, self.work_dir, set(self._attempts))
        self._saver.save()

    async def _watch(self, att: Attempt) -> None:
        try:
            await self._supervise(att)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("adopted attempt %s", att.command.attempt_id)
            if att.final is None:
                self._report(att, "FAILED", reason=f"Node agent error: {exc}")
        self._finish(att)

    def _records(self) -> dict[str, str]:
        return {aid: att.encoded(self.runtime.name) for aid, att in self._attempts.items()}

    # ----- sending --------------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        now = _now_ms()
        return {"event_id": uuid7(now), "occurred_at": now}

    def _note(self, attempt_id: str, what: str) -> None:
        self.trace.append((time.time(), attempt_id, what))
        log.info("attempt %s: %s", attempt_id, what)

    def _report(
        self, att: Attempt, status: AttemptStatus, reason: str | None = None, exit_code: int | None = None
    ) -> None:
        cmd = att.command
        self._note(cmd.attempt_id, f"report {status}" + (f": {reason}" if reason else ""))
        report = AttemptReport(
            **self._meta(),
            node_id=self.node_id,
            job_id=cmd.job_id,
            attempt_id=cmd.attempt_id,
            status=status,
            exit_code=exit_code,
            status_reason=reason[:1024] if reason else None,
            outputs=attempt_outputs(cmd, self.work_dir) if status in FINAL else (),
        )
        att.status = status
        if status in FINAL:
            att.move(AttemptPhase.ENDED)
            att.final = report
            self._saver.changed(before_send=True)  # the outcome is on disk before it is sent
        self._emit(report)

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
                    head = head_batch(self._outbox) if self._send_many else [self._outbox[0]]
                    await self._saver.before_send()  # covers the head: reports queued meanwhile wait
                    failure = await self._send_head(head)
                finally:
                    self._sending = False
                if failure is not None:
                    self.send_failures += 1
                    self._link_down = True
                    log.warning("send failed (%s); retrying in %.2f s", failure, delay)
                    await asyncio.sleep(delay)  # back-off before the retry
                    delay = min(delay * 2, self._max_retry)
                    continue
                delay = self._retry

    async def _send_head(self, head: list[SchedulerInput]) -> BaseException | None:
        """Sends the outbox's head (a batch with ``send_many``); returns the first failure (sent again)."""
        try:
            failures = await self._send_many(head) if self._send_many else (await self._send(head[0]),)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return exc
        for failure in failures:
            if isinstance(failure, BaseException):
                return failure
            self._delivered(self._outbox.popleft())
        return None

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)  # the heartbeat period
            if not self._registered or self._link_down:
                continue  # not registered yet (or any more), or the outbox is retrying a failed send
            try:
                contained = getattr(self.runtime, "contained", False)
                await refresh(self._attempts.values(), self.work_dir, contained, self.data.uploaded)
                await self._saver.before_send()  # the statuses it lists are on disk
                await self._send(NodeHeartbeat(**self._meta(), node_id=self.node_id, attempts=self._known()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat not sent: %s", exc)
