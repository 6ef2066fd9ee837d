"""The node agent: registers a node, runs the attempts the scheduler places on it, reports them.

Everything it sends goes through an ordered outbox (``sending.Outbox``), so reports arrive in order
and none is lost while the agent runs; ``supervise.AttemptRunner`` runs each attempt and writes its
reports. This module is the node's side of the conversation: registration, the commands, heartbeats,
drain and restart. Heartbeats bypass the outbox's queue: they
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
from collections import OrderedDict
from pathlib import Path

from gpuquota.core.policy import DEFAULT_POLICY
from gpuquota.node_agent.checkpoint_watch import refresh
from gpuquota.node_agent.launch import Runtime
from gpuquota.node_agent.payload import BadPayload, parse_payload
from gpuquota.node_agent.prepare import exit_path
from gpuquota.node_agent.records import KEEP_FINISHED, Attempt, AttemptBook, AttemptPhase
from gpuquota.node_agent.runtime import describe
from gpuquota.node_agent.s3_stage import DataPlane
from gpuquota.node_agent.saving import StateSaver
from gpuquota.node_agent.sending import Outbox, Send, SendMany, stamp
from gpuquota.node_agent.supervise import FINAL, AttemptRunner
from gpuquota.support.dirlock import DirectoryLock
from gpuquota.support.ids import uuid4
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import (
    AttemptReport,
    DeregisterNode,
    DrainNode,
    NodeAttempt,
    NodeHeartbeat,
    RegisterNode,
    SchedulerInput,
)
from gpuquota.wire.node_commands import NodeCommand, RegisterAgain, RunAttempt, StopAttempt

log = logging.getLogger(__name__)


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
        training_plan: str | None = None,
    ) -> None:
        self.node_id = node_id
        self.training_plan = training_plan
        """The training plan this node belongs to (S11): its slots are used only in the plan's windows."""
        self.data = data if data is not None and runtime.name != "simulated" else DataPlane(None)
        """S3: channels in, checkpoints and artifacts out (``s3_stage``); without a store, none."""
        self.address = address  # how other nodes reach this one (empty: by its node id)
        self.pool = pool
        self.runtime = runtime
        self.work_dir = Path(work_dir).absolute()
        self.book = AttemptBook(self.work_dir, node_id)
        self.lock = DirectoryLock(self.work_dir)
        self.heartbeat_seconds = heartbeat_seconds
        self._saver = StateSaver(self.book, self._records)
        self.outbox = Outbox(
            send, send_many, self._saver.before_send, self._delivered, retry_seconds, max_retry_seconds
        )
        self.runner = AttemptRunner(
            node_id,
            slots,
            runtime,
            self.work_dir,
            self.data,
            self._saver,
            preemption_grace,
            emit=self.outbox.emit,
            note=self._note,
            finished=self._finish,
            forget=self._forget,
        )
        self._attempts: dict[str, Attempt] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._registered = False
        """The RegisterNode was sent and no DeregisterNode yet: heartbeats may go out."""
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
        self.trace: list[tuple[float, str, str]] = []
        """(epoch seconds, attempt id, what happened): signals, group gone, reports; for timelines."""

    # ----- lifecycle ------------------------------------------------------------------------------

    @property
    def slots(self) -> tuple[SlotOffer, ...]:
        """What the node offers, as its runner launches on it (set once, at construction)."""
        return self.runner.slots

    @property
    def state_path(self) -> Path:
        return self.book.state_path

    @property
    def active_attempts(self) -> list[str]:
        return [a for a, att in self._attempts.items() if not att.done.is_set()]

    @property
    def connected(self) -> bool:
        """Registered with the scheduler, and the last send to it succeeded (``/health/ready``)."""
        return self._registered and not self.outbox.link_down

    @property
    def send_failures(self) -> int:
        return self.outbox.failures

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
                self.outbox.emit(att.final)  # its delivery was not confirmed before the restart
        self._tasks.append(asyncio.create_task(self.outbox.run(), name=f"agent-{self.node_id}-outbox"))
        self._tasks.append(asyncio.create_task(self._heartbeats(), name=f"agent-{self.node_id}-heartbeat"))

    async def drain(self, timeout: float | None = None) -> None:
        """DrainNode; wait for the attempts to end (at most ``timeout`` s, then stop them: STOPPED);
        DeregisterNode; flush the outbox; stop."""
        self._draining = True
        self.outbox.emit(DrainNode(**stamp(), node_id=self.node_id))
        pending = [a.done.wait() for a in self._attempts.values() if not a.done.is_set()]
        if pending:
            _, late = await asyncio.wait([asyncio.ensure_future(p) for p in pending], timeout=timeout)
            for fut in late:
                fut.cancel()
        for att in list(self._attempts.values()):
            if not att.done.is_set():
                self.runner.request_stop(att, f"Node {self.node_id} drained: attempt handed back")
        await self._ended()
        self._leaving = True
        self.outbox.emit(DeregisterNode(**stamp(), node_id=self.node_id))
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
                self.runner.request_stop(att, reason)
        await self._ended()

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
        await self.outbox.flush(timeout)
        await self._saver.flush()  # what was delivered is on disk too

    async def _ended(self) -> None:
        """Waits until every attempt is over."""
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
            self.runner.launch(att)
        elif isinstance(command, StopAttempt):
            stopping = self._attempts.get(command.attempt_id)
            if stopping is None or stopping.done.is_set():
                log.info("ignoring StopAttempt for unknown or finished attempt %s", command.attempt_id)
                return
            self.runner.request_stop(stopping, command.reason)
        elif isinstance(command, RegisterAgain):
            self._register_again(command.reason)

    def _register(self) -> None:
        """A new incarnation and the attempts it knows, taken together: a ``RunAttempt`` for an earlier
        incarnation that is not among them is requeued by the scheduler, and dropped here."""
        self.registrations += 1
        self.incarnation = uuid4()
        node = {"node_id": self.node_id, "pool": self.pool, "slots": self.slots, "address": self.address}
        self.outbox.emit(
            RegisterNode(
                **stamp(),
                **node,
                attempts=self._known(),
                incarnation=self.incarnation,
                training_plan=self.training_plan,
            )
        )

    def _known(self) -> tuple[NodeAttempt, ...]:
        return tuple(att.known() for att in self._attempts.values())

    def _register_again(self, reason: str) -> None:
        """The scheduler does not count the node as registered (lost, or unknown): register again,
        listing the attempts still running, so the scheduler fences those it no longer assigns."""
        if not self._started or self._leaving:
            log.info("ignoring RegisterAgain (%s): the agent is not running or deregisters", reason)
            return
        if any(isinstance(m, RegisterNode) for m in self.outbox.queued):
            log.info("ignoring RegisterAgain (%s): a RegisterNode is on its way", reason)
            return
        log.warning("node %s registers again: %s", self.node_id, reason)
        self._register()  # it lists the attempts the agent runs: the scheduler fences them
        if self._draining:
            self.outbox.emit(DrainNode(**stamp(), node_id=self.node_id))

    # ----- attempts over -------------------------------------------------------------------------

    def _finish(self, att: Attempt) -> None:
        """The attempt is over; it is forgotten once its final report is delivered (``_delivered``)."""
        att.done.set()
        if att.command.attempt_id in self._attempts:
            self._saver.changed()

    def _delivered(self, sent: SchedulerInput) -> None:
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
            self.runner.adopt(att)
        sweep = getattr(self.runtime, "sweep", None)  # removes what a dead agent started but never recorded
        if sweep is not None:
            sweep(self.node_id, self.work_dir, set(self._attempts))
        self._saver.save()

    def _records(self) -> dict[str, str]:
        return {aid: att.encoded(self.runtime.name) for aid, att in self._attempts.items()}

    # ----- heartbeats -----------------------------------------------------------------------------

    def _note(self, attempt_id: str, what: str) -> None:
        self.trace.append((time.time(), attempt_id, what))
        log.info("attempt %s: %s", attempt_id, what)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)  # the heartbeat period
            if not self._registered or self.outbox.link_down:
                continue  # not registered yet (or any more), or the outbox is retrying a failed send
            try:
                contained = self.runner.contained
                await refresh(self._attempts.values(), self.work_dir, contained, self.data.uploaded)
                await self._saver.before_send()  # the statuses it lists are on disk
                await self.outbox.send(NodeHeartbeat(**stamp(), node_id=self.node_id, attempts=self._known()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat not sent: %s", exc)
