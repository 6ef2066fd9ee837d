"""Fluent builders and a scheduler harness for core tests.

    h = Harness.worked_example()          # S8's SE, queue and three shares, one 3-slot node
    h.submit(job("a").share("QS1").priority(3))
    h.running("a")                        # the node reports STARTING and RUNNING
    assert h.status("a") == "RUNNING"

Every ``Harness`` call feeds one input through ``decide`` then ``evolve`` (as the shells do), keeps
the inputs and events, and checks after each input that deciding did not touch the state.
"""

from __future__ import annotations

from typing import Any

from gpuquota.core import ClusterState, decide, evolve, explain, fingerprint
from gpuquota.wire import events as ev
from gpuquota.wire import inputs as inp
from gpuquota.wire.base import (
    CapacityLimit,
    ExitRule,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    SchedulingPolicySpec,
    ServiceEnvironmentSpec,
    SlotOffer,
    State,
    Strategy,
    TimeLimitAction,
)

G5 = "ml.g5.xlarge"
P4 = "ml.p4d.24xlarge"


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self.fields: dict[str, Any] = {
            "job_id": job_id,
            "job_name": job_id,
            "job_queue": "jq",
            "quota_share": "QS1",
            "priority": 0,
            "unit": G5,
            "count": 1,
        }

    def share(self, name: str) -> JobBuilder:
        self.fields["quota_share"] = name
        return self

    def queue(self, name: str) -> JobBuilder:
        self.fields["job_queue"] = name
        return self

    def priority(self, value: int) -> JobBuilder:
        self.fields["priority"] = value
        return self

    def needs(self, count: int, unit: str = G5) -> JobBuilder:
        self.fields["count"] = count
        self.fields["unit"] = unit
        return self

    def retries(self, attempts: int, *rules: tuple[str, str]) -> JobBuilder:
        self.fields["retry_attempts"] = attempts
        self.fields["evaluate_on_exit"] = tuple(ExitRule(action=a, on_status_reason=g) for a, g in rules)
        return self

    def preemption_retries(self, value: int) -> JobBuilder:
        self.fields["preemption_retries"] = value
        return self

    def timeout(self, seconds: int) -> JobBuilder:
        self.fields["attempt_duration_seconds"] = seconds
        return self

    def build(self, created_at: int) -> JobSpec:
        return JobSpec(created_at=created_at, **self.fields)


def job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


class ShareBuilder:
    def __init__(self, name: str) -> None:
        self.fields: dict[str, Any] = {
            "name": name,
            "job_queue": "jq",
            "capacity_limits": (),
            "strategy": Strategy.LEND,
        }

    def queue(self, name: str) -> ShareBuilder:
        self.fields["job_queue"] = name
        return self

    def limit(self, max_capacity: int, unit: str = G5) -> ShareBuilder:
        limits = tuple(c for c in self.fields["capacity_limits"] if c.unit != unit)
        self.fields["capacity_limits"] = (*limits, CapacityLimit(unit=unit, max_capacity=max_capacity))
        return self

    def reserve(self) -> ShareBuilder:
        self.fields["strategy"] = Strategy.RESERVE
        return self

    def lend(self) -> ShareBuilder:
        self.fields["strategy"] = Strategy.LEND
        return self

    def lend_and_borrow(self, borrow_limit: int = -1) -> ShareBuilder:
        self.fields["strategy"] = Strategy.LEND_AND_BORROW
        self.fields["borrow_limit"] = borrow_limit
        return self

    def in_share_preemption(self, enabled: bool = True) -> ShareBuilder:
        self.fields["in_share_preemption"] = enabled
        return self

    def disabled(self) -> ShareBuilder:
        self.fields["state"] = State.DISABLED
        return self

    def build(self) -> QuotaShareSpec:
        return QuotaShareSpec(**self.fields)


def share(name: str) -> ShareBuilder:
    return ShareBuilder(name)


class Harness:
    """Drives the core like a shell does and remembers everything for assertions."""

    def __init__(self, heartbeat_timeout_ms: int = 30_000) -> None:
        self.state = ClusterState(heartbeat_timeout_ms)
        self.now = 1_000_000
        self.serial = 0
        self.inputs: list[inp.SchedulerInput] = []
        self.events: list[ev.SchedulerEvent] = []
        self.last: list[ev.SchedulerEvent] = []

    # ----- plumbing ----------------------------------------------------------------------------

    def next_id(self) -> str:
        self.serial += 1
        return f"in-{self.serial}"

    def advance(self, ms: int = 1) -> Harness:
        self.now += ms
        return self

    def feed(self, message_type: type[Any], **fields: Any) -> list[ev.SchedulerEvent]:
        self.now += 1
        message = message_type(event_id=self.next_id(), occurred_at=self.now, **fields)
        before = fingerprint(self.state)
        events = decide(self.state, message)
        assert fingerprint(self.state) == before, "decide changed the state"
        for event in events:
            evolve(self.state, event)
        self.inputs.append(message)
        self.events.extend(events)
        self.last = events
        return events

    # ----- resources ---------------------------------------------------------------------------

    def policy(self, name: str = "policy", backfill: bool = False) -> Harness:
        self.feed(inp.CreateSchedulingPolicy, spec=SchedulingPolicySpec(name=name, backfill=backfill))
        return self

    def environment(self, name: str = "se", pool: str = "default", **limits: int) -> Harness:
        caps = tuple(CapacityLimit(unit=u.replace("_", "."), max_capacity=c) for u, c in limits.items())
        self.feed(
            inp.CreateServiceEnvironment,
            spec=ServiceEnvironmentSpec(name=name, capacity_limits=caps, pool=pool),
        )
        return self

    def environment_limits(self, name: str, limits: dict[str, int], **fields: Any) -> Harness:
        caps = tuple(CapacityLimit(unit=u, max_capacity=c) for u, c in limits.items())
        kind = (
            inp.UpdateServiceEnvironment if name in self.state.environments else inp.CreateServiceEnvironment
        )
        self.feed(kind, spec=ServiceEnvironmentSpec(name=name, capacity_limits=caps, **fields))
        return self

    def queue(
        self,
        name: str = "jq",
        environment: str = "se",
        policy: str = "policy",
        priority: int = 1,
        time_limit: int | None = None,
    ) -> Harness:
        actions = (
            ()
            if time_limit is None
            else (TimeLimitAction(reason="Stuck at head", max_time_seconds=time_limit),)
        )
        spec = JobQueueSpec(
            name=name,
            service_environment=environment,
            scheduling_policy=policy,
            priority=priority,
            time_limit_actions=actions,
        )
        self.feed(inp.CreateJobQueue, spec=spec)
        return self

    def share(self, builder: ShareBuilder) -> Harness:
        spec = builder.build()
        kind = (
            inp.UpdateQuotaShare if (spec.job_queue, spec.name) in self.state.shares else inp.CreateQuotaShare
        )
        self.feed(kind, spec=spec)
        return self

    def node(self, node_id: str, pool: str = "default", **units: int) -> Harness:
        slots = []
        gpu = 0
        for unit, count in units.items():
            for _ in range(count):
                slots.append(SlotOffer(unit=unit.replace("_", "."), gpus=(gpu,)))
                gpu += 1
        self.feed(inp.RegisterNode, node_id=node_id, pool=pool, slots=tuple(slots))
        return self

    @classmethod
    def basic(cls, capacity: int = 3, nodes: int = 1) -> Harness:
        """One SE with ``capacity`` g5 instances, one queue, no shares, ``nodes`` nodes."""
        h = cls().policy().environment_limits("se", {G5: capacity}).queue()
        per_node, extra = divmod(capacity, nodes)
        for index in range(nodes):
            h.node(f"node-{index}", ml_g5_xlarge=per_node + (1 if index < extra else 0))
        return h

    @classmethod
    def worked_example(cls) -> Harness:
        """S8: SE g5 x 3; QS1 LEND_AND_BORROW 200 % with in-share preemption; QS2 LEND; QS3 RESERVE."""
        h = cls.basic(capacity=3)
        h.share(share("QS1").limit(1).lend_and_borrow(200).in_share_preemption())
        h.share(share("QS2").limit(1).lend())
        h.share(share("QS3").limit(1).reserve())
        return h

    # ----- jobs --------------------------------------------------------------------------------

    def submit(self, *builders: JobBuilder) -> Harness:
        for builder in builders:
            self.feed(inp.SubmitJob, job=builder.build(created_at=self.now + 1))
        return self

    def set_priority(self, job_id: str, priority: int) -> Harness:
        self.feed(inp.UpdateJobPriority, job_id=job_id, priority=priority)
        return self

    def terminate(self, job_id: str, reason: str = "Terminated by user") -> Harness:
        self.feed(inp.TerminateJob, job_id=job_id, reason=reason)
        return self

    def report(self, job_id: str, status: str, **fields: Any) -> Harness:
        record = self.state.jobs[job_id]
        assert record.attempt_id is not None, f"{job_id} has no attempt"
        for node_id in sorted({p.node_id for p in record.placements}):
            self.feed(
                inp.AttemptReport,
                node_id=node_id,
                job_id=job_id,
                attempt_id=record.attempt_id,
                status=status,
                **fields,
            )
            if job_id not in self.state.jobs or self.state.jobs[job_id].attempt_id != record.attempt_id:
                break
        return self

    def running(self, *job_ids: str) -> Harness:
        for job_id in job_ids:
            self.report(job_id, "STARTING").report(job_id, "RUNNING")
        return self

    def stopped(self, *job_ids: str) -> Harness:
        for job_id in job_ids:
            self.report(job_id, "STOPPED")
        return self

    def succeed(self, *job_ids: str) -> Harness:
        for job_id in job_ids:
            self.report(job_id, "SUCCEEDED")
        return self

    def fail(self, job_id: str, reason: str = "Essential container in task exited with code 1") -> Harness:
        return self.report(job_id, "FAILED", exit_code=1, status_reason=reason)

    def stop_all_preempted(self) -> Harness:
        """Nodes report every stopping attempt stopped (in job id order)."""
        for job_id in sorted(j.job_id for j in self.state.jobs.values() if j.stop is not None):
            self.stopped(job_id)
        return self

    def tick(self, advance_ms: int = 0) -> Harness:
        self.now += advance_ms
        self.feed(inp.Tick)
        return self

    def heartbeat(self, node_id: str) -> Harness:
        self.feed(inp.NodeHeartbeat, node_id=node_id)
        return self

    # ----- observations ------------------------------------------------------------------------

    def status(self, job_id: str) -> str:
        """The job's status as the read model would show it (terminal jobs from the log)."""
        record = self.state.jobs.get(job_id)
        if record is not None:
            return record.status.value
        for event in reversed(self.events):
            if isinstance(event, ev.JobSucceeded | ev.JobFailed) and event.job_id == job_id:
                return event.status.value
        for event in reversed(self.events):
            if isinstance(event, ev.InputRejected) and event.job_id == job_id:
                return "REJECTED"
        raise KeyError(job_id)

    def statuses(self, *job_ids: str) -> dict[str, str]:
        return {job_id: self.status(job_id) for job_id in job_ids}

    def preempted(self) -> list[tuple[str, str, str]]:
        """(victim, preemptor, kind) of every preemption so far."""
        return [(e.job_id, e.preemptor_job_id, e.kind) for e in self.events if isinstance(e, ev.JobPreempted)]

    def stopping(self, job_id: str) -> bool:
        record = self.state.jobs.get(job_id)
        return record is not None and record.stop is not None

    def rejections(self) -> list[str]:
        return [e.reason for e in self.last if isinstance(e, ev.InputRejected)]

    def usage(self, share_name: str, unit: str = G5, queue: str = "jq") -> int:
        return self.state.shares[(queue, share_name)].usage.get(unit, 0)

    def explain(self, job_id: str) -> str:
        explanation = explain(self.state, job_id)
        assert explanation is not None
        return explanation.reason
