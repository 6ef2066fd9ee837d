"""Running one attempt on the node: prepare and record it, stage its channels in, launch it, watch it
(its ``MaxRuntimeInSeconds``, stop requests: SIGTERM, the preemption grace, SIGKILL), stage its
checkpoints and artifacts out, and report each step (``AttemptReport``) through the agent's outbox.

An attempt a restarted agent adopts is watched the same way from its launch on. A failure of the agent
while it runs one attempt never takes the agent down: the attempt is reported FAILED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuquota.node_agent.launch import LaunchError, Runtime
from gpuquota.node_agent.outcomes import FinalStatus, final_status
from gpuquota.node_agent.payload import BadPayload
from gpuquota.node_agent.prepare import attempt_outputs, prepared_and_recorded
from gpuquota.node_agent.records import Attempt, AttemptPhase
from gpuquota.node_agent.s3_stage import DataPlane
from gpuquota.node_agent.saving import StateSaver
from gpuquota.node_agent.sending import stamp
from gpuquota.observe.logs import bind
from gpuquota.wire.base import SlotOffer
from gpuquota.wire.inputs import AttemptReport, AttemptStatus, SchedulerInput

log = logging.getLogger(__name__)

FINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass(eq=False)
class AttemptRunner:
    """Runs and watches the attempts of one node. ``emit`` queues a report in the outbox, ``note`` adds
    a line to the agent's trace, ``finished`` is told of an attempt that is over, ``forget`` of one to
    forget unreported (adopted, and nothing says how it ended)."""

    node_id: str
    slots: tuple[SlotOffer, ...]
    runtime: Runtime
    work_dir: Path
    data: DataPlane
    saver: StateSaver
    preemption_grace: float
    emit: Callable[[SchedulerInput], None] = field(kw_only=True)
    note: Callable[[str, str], None] = field(kw_only=True)
    finished: Callable[[Attempt], None] = field(kw_only=True)
    forget: Callable[[str], None] = field(kw_only=True)

    @property
    def contained(self) -> bool:
        """The runtime runs attempts in containers (their paths differ from the node's)."""
        return bool(getattr(self.runtime, "contained", False))

    def launch(self, att: Attempt) -> None:
        att.task = asyncio.create_task(self._run(att), name=f"attempt-{att.command.attempt_id}")

    def adopt(self, att: Attempt) -> None:
        """Watches an attempt a previous agent launched (its ``handle`` from ``Runtime.adopt``)."""
        att.task = asyncio.create_task(self._watch(att), name=f"adopted-{att.command.attempt_id}")

    def request_stop(self, att: Attempt, reason: str) -> None:
        if not att.stoppable:
            return
        att.stop_reason = reason
        att.move(AttemptPhase.STOP_REQUESTED)
        self._start_stop(att)

    def _start_stop(self, att: Attempt) -> None:
        if att.handle is not None and att.stop_task is None:
            aid = att.command.attempt_id
            att.stop_task = asyncio.create_task(
                att.handle.stop(self.preemption_grace, lambda what: self.note(aid, what))
            )

    async def _run(self, att: Attempt) -> None:
        cmd = att.command
        bind(node_id=self.node_id, job_id=cmd.job_id, attempt_id=cmd.attempt_id)  # every line of this task
        try:
            self._report(att, "STARTING")
            try:
                spec = await prepared_and_recorded(
                    cmd, self.node_id, self.slots, self.work_dir, self.saver.durable, contained=self.contained
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
            self.note(cmd.attempt_id, f"launched (pid {att.handle.pid})")
            self.saver.changed()
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
        self.finished(att)

    async def _watch(self, att: Attempt) -> None:
        try:
            await self._supervise(att)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("adopted attempt %s", att.command.attempt_id)
            if att.final is None:
                self._report(att, "FAILED", reason=f"Node agent error: {exc}")
        self.finished(att)

    async def _supervise(self, att: Attempt) -> None:
        handle = att.handle
        assert handle is not None
        cmd, contained = att.command, self.contained
        syncing = self.data.checkpoints(cmd, self.work_dir, contained)
        waiter = asyncio.ensure_future(handle.wait())
        try:
            if att.max_runtime is not None:
                left = att.max_runtime - (time.time() - att.started_at)
                done, _ = await asyncio.wait({waiter}, timeout=max(0.0, left))
                if not done and att.stop_reason is None:
                    att.timed_out = True
                    self.note(att.command.attempt_id, f"MaxRuntimeInSeconds ({att.max_runtime:g}) exceeded")
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
            self.note(att.command.attempt_id, "ended with no exit status: lost")
            self.forget(att.command.attempt_id)
        else:
            self._report(att, "FAILED", reason="Attempt lost")

    def _report(
        self, att: Attempt, status: AttemptStatus, reason: str | None = None, exit_code: int | None = None
    ) -> None:
        cmd = att.command
        self.note(cmd.attempt_id, f"report {status}" + (f": {reason}" if reason else ""))
        report = AttemptReport(
            **stamp(),
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
            self.saver.changed(before_send=True)  # the outcome is on disk before it is sent
        self.emit(report)
