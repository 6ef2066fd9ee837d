"""Fluent builders and a scheduler harness for core tests.

    h = Harness.worked_example()          # S8's SE, queue and three shares, one 3-slot node
    h.submit(job("a").share("QS1").priority(3))
    h.running("a")                        # the node reports STARTING and RUNNING
    assert h.status("a") == "RUNNING"

Every ``Harness`` call feeds one input through ``decide`` then ``evolve`` (as the shells do), keeps
the inputs and events, and checks after each input that deciding did not touch the state.

Table-driven scenarios use ``Case``/``Round`` and the ``do`` step namespace:

    Case("S4.1", Harness.worked_example, [
        Round([do.submit(job("a").share("QS2"))], want_status={"a": "SCHEDULED"}),
    ])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuquota.core import ClusterState, decide, evolve, explain, fingerprint
from gpuquota.core.blocked import QUOTA_MANAGEMENT_LIMIT_EXCEEDED
from gpuquota.core.lifecycle import algorithm_error
from gpuquota.core.state import JobRecord
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

    def token(self, client_token: str) -> JobBuilder:
        self.fields["client_token"] = client_token
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

    def tag(self, key: str, value: str) -> ShareBuilder:
        self.fields["tags"] = {**self.fields.get("tags", {}), key: value}
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
        self.decisions: list[tuple[inp.SchedulerInput, list[ev.SchedulerEvent]]] = []
        """Every input with the events decided for it, in order."""

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
            self.before_event(event)
            evolve(self.state, event)
            self.after_event(event)
        self.inputs.append(message)
        self.events.extend(events)
        self.decisions.append((message, events))
        self.last = events
        return events

    def before_event(self, event: ev.SchedulerEvent) -> None:
        """Hook: called with the state as the core saw it when it decided ``event``."""

    def after_event(self, event: ev.SchedulerEvent) -> None:
        """Hook: called once ``event`` has been applied."""

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
        time_limit_reason: str = QUOTA_MANAGEMENT_LIMIT_EXCEEDED,
    ) -> Harness:
        actions = (
            ()
            if time_limit is None
            else (TimeLimitAction(reason=time_limit_reason, max_time_seconds=time_limit),)
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
    def basic(
        cls, capacity: int = 3, nodes: int = 1, backfill: bool = False, time_limit: int | None = None
    ) -> Harness:
        """One SE with ``capacity`` g5 instances, one queue, no shares, ``nodes`` nodes."""
        h = cls().policy(backfill=backfill).environment_limits("se", {G5: capacity})
        h.queue(time_limit=time_limit)
        per_node, extra = divmod(capacity, nodes)
        for index in range(nodes):
            h.node(f"node-{index}", ml_g5_xlarge=per_node + (1 if index < extra else 0))
        return h

    def with_shares(self, *builders: ShareBuilder) -> Harness:
        for builder in builders:
            self.share(builder)
        return self

    def delete_share(self, name: str, queue: str = "jq") -> Harness:
        self.feed(inp.DeleteQuotaShare, job_queue=queue, name=name)
        return self

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
        attempt_id = record.attempt_id
        assert attempt_id is not None, f"{job_id} has no attempt"
        for node_id in sorted({p.node_id for p in record.placements}):
            self.feed(
                inp.AttemptReport,
                node_id=node_id,
                job_id=job_id,
                attempt_id=attempt_id,
                status=status,
                **fields,
            )
            if job_id not in self.state.jobs or self.state.jobs[job_id].attempt_id != attempt_id:
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

    def fail(self, job_id: str, reason: str = algorithm_error("exited with code 1")) -> Harness:
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

    def elapse(self, ms: int, silent: Iterable[str] = ()) -> Harness:
        """Let ``ms`` pass in steps of half the heartbeat timeout: every online node not in ``silent``
        heartbeats, then a ``Tick`` fires (timeouts, node loss, time limits)."""
        quiet = set(silent)
        step = max(1, self.state.heartbeat_timeout_ms // 2)
        remaining = ms
        while remaining > 0:
            chunk = min(step, remaining)
            self.now += chunk
            remaining -= chunk
            for node_id in sorted(n.node_id for n in self.state.nodes.values() if n.online):
                if node_id not in quiet:
                    self.heartbeat(node_id)
            self.tick()
        return self

    def drain(self, node_id: str) -> Harness:
        self.feed(inp.DrainNode, node_id=node_id)
        return self

    def undrain(self, node_id: str) -> Harness:
        self.feed(inp.UndrainNode, node_id=node_id)
        return self

    def deregister(self, node_id: str) -> Harness:
        self.feed(inp.DeregisterNode, node_id=node_id)
        return self

    def report_attempt(
        self, node_id: str, job_id: str, attempt_id: str, status: str, **fields: Any
    ) -> Harness:
        """A report naming an explicit attempt (late or misdirected reports)."""
        self.feed(
            inp.AttemptReport, node_id=node_id, job_id=job_id, attempt_id=attempt_id, status=status, **fields
        )
        return self

    # ----- observations ------------------------------------------------------------------------

    def record(self, job_id: str) -> JobRecord:
        return self.state.jobs[job_id]

    def reason(self, job_id: str) -> str:
        """The job's ``statusReason`` (terminal jobs from the log)."""
        record = self.state.jobs.get(job_id)
        if record is not None:
            return record.status_reason
        for event in reversed(self.events):
            if isinstance(event, ev.JobSucceeded | ev.JobFailed) and event.job_id == job_id:
                return event.status_reason
        raise KeyError(job_id)

    def blocked(self, job_id: str) -> str | None:
        """The code the job is recorded as blocked with at the head of its share (S9.1), or None."""
        share = self.state.shares[self.state.jobs[job_id].share]
        return share.blocked[1] if share.blocked is not None and share.blocked[0] == job_id else None

    def terminated(self, job_id: str) -> bool:
        return any(
            isinstance(e, ev.JobFailed) and e.job_id == job_id and e.is_terminated for e in self.events
        )

    def dispatches(self, job_id: str) -> list[ev.JobDispatched]:
        return [e for e in self.events if isinstance(e, ev.JobDispatched) and e.job_id == job_id]

    def placement(self, job_id: str) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
        """(node, slots, gpus) of the job's current attempt."""
        return [(p.node_id, p.slots, p.gpus) for p in self.state.jobs[job_id].placements]

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
        explanation = explain(self.state, job_id, now=self.now)
        assert explanation is not None
        return explanation.reason

    def waits_until(self, job_id: str) -> int | None:
        explanation = explain(self.state, job_id, now=self.now)
        assert explanation is not None
        return explanation.until


# ----- table-driven scenarios ------------------------------------------------------------------

CROSS = "CROSS_SHARE"
IN_SHARE = "IN_SHARE"


@dataclass(frozen=True)
class Step:
    """One action of a scenario round, applied to a ``Harness``; ``label`` names it in failures."""

    label: str
    run: Callable[[Harness], object]

    def __call__(self, h: Harness) -> None:
        self.run(h)

    def __repr__(self) -> str:
        return self.label


class Do:
    """Step constructors: ``do.submit(job("a"))``, ``do.succeed("a")``, ``do.elapse(31_000)``..."""

    @staticmethod
    def submit(*builders: JobBuilder) -> Step:
        ids = ",".join(b.fields["job_id"] for b in builders)
        return Step(f"submit({ids})", lambda h: h.submit(*builders))

    @staticmethod
    def set_priority(job_id: str, priority: int) -> Step:
        return Step(f"set_priority({job_id},{priority})", lambda h: h.set_priority(job_id, priority))

    @staticmethod
    def tag(job_id: str, **tags: str) -> Step:
        return Step(f"tag({job_id})", lambda h: h.feed(inp.TagJob, job_id=job_id, tags=tags))

    @staticmethod
    def starting(*job_ids: str) -> Step:
        return Step(f"starting{job_ids}", lambda h: [h.report(j, "STARTING") for j in job_ids])

    @staticmethod
    def running(*job_ids: str) -> Step:
        return Step(f"running{job_ids}", lambda h: h.running(*job_ids))

    @staticmethod
    def succeed(*job_ids: str) -> Step:
        return Step(f"succeed{job_ids}", lambda h: h.succeed(*job_ids))

    @staticmethod
    def fail(job_id: str, reason: str = algorithm_error("exited with code 1")) -> Step:
        return Step(f"fail({job_id},{reason!r})", lambda h: h.fail(job_id, reason))

    @staticmethod
    def stopped(*job_ids: str) -> Step:
        return Step(f"stopped{job_ids}", lambda h: h.stopped(*job_ids))

    @staticmethod
    def stop_all() -> Step:
        """Nodes report every stopping attempt stopped."""
        return Step("stop_all", lambda h: h.stop_all_preempted())

    @staticmethod
    def terminate(job_id: str, reason: str = "Terminated by user") -> Step:
        return Step(f"terminate({job_id})", lambda h: h.terminate(job_id, reason))

    @staticmethod
    def tick(advance_ms: int = 0) -> Step:
        """A bare ``Tick`` after ``advance_ms`` (no heartbeats: nodes may be lost)."""
        return Step(f"tick(+{advance_ms}ms)", lambda h: h.tick(advance_ms))

    @staticmethod
    def elapse(ms: int, silent: Sequence[str] = ()) -> Step:
        """Time passes with heartbeats from every online node except ``silent`` ones, ticking."""
        return Step(f"elapse({ms}ms,silent={list(silent)})", lambda h: h.elapse(ms, silent))

    @staticmethod
    def register(node_id: str, pool: str = "default", **units: int) -> Step:
        return Step(f"register({node_id},{units})", lambda h: h.node(node_id, pool, **units))

    @staticmethod
    def heartbeat(node_id: str) -> Step:
        return Step(f"heartbeat({node_id})", lambda h: h.heartbeat(node_id))

    @staticmethod
    def drain(node_id: str) -> Step:
        return Step(f"drain({node_id})", lambda h: h.drain(node_id))

    @staticmethod
    def undrain(node_id: str) -> Step:
        return Step(f"undrain({node_id})", lambda h: h.undrain(node_id))

    @staticmethod
    def deregister(node_id: str) -> Step:
        return Step(f"deregister({node_id})", lambda h: h.deregister(node_id))

    @staticmethod
    def update_share(builder: ShareBuilder) -> Step:
        """Create or update a quota share (the whole spec)."""
        return Step(f"share({builder.fields['name']})", lambda h: h.share(builder))

    @staticmethod
    def se_limits(name: str, limits: Mapping[str, int], **fields: Any) -> Step:
        return Step(
            f"se_limits({name},{dict(limits)})", lambda h: h.environment_limits(name, dict(limits), **fields)
        )

    @staticmethod
    def delete_share(name: str, queue: str = "jq") -> Step:
        return Step(f"delete_share({name})", lambda h: h.delete_share(name, queue))

    @staticmethod
    def report(node_id: str, job_id: str, attempt_id: str, status: str, **fields: Any) -> Step:
        """A node report naming an explicit attempt (late, fenced or misdirected)."""
        return Step(
            f"report({node_id},{attempt_id},{status})",
            lambda h: h.report_attempt(node_id, job_id, attempt_id, status, **fields),
        )

    @staticmethod
    def feed(message_type: type[Any], **fields: Any) -> Step:
        """Any raw input (bad input, resource commands)."""
        return Step(f"{message_type.__name__}({fields})", lambda h: h.feed(message_type, **fields))


do = Do()


@dataclass(frozen=True)
class Check:
    """A named predicate over the harness, checked after a round."""

    label: str
    holds: Callable[[Harness], bool]

    def __repr__(self) -> str:
        return self.label


class Expect:
    """Check constructors: ``expect.stopping("a")``, ``expect.attempt("a", 2)``..."""

    @staticmethod
    def that(label: str, holds: Callable[[Harness], bool]) -> Check:
        return Check(label, holds)

    @staticmethod
    def stopping(*job_ids: str) -> Check:
        return Check(f"stopping{job_ids}", lambda h: all(h.stopping(j) for j in job_ids))

    @staticmethod
    def attempt(job_id: str, number: int) -> Check:
        return Check(f"{job_id} attempt {number}", lambda h: h.record(job_id).attempt_number == number)

    @staticmethod
    def preempted_count(job_id: str, count: int) -> Check:
        return Check(f"{job_id} preempted {count}x", lambda h: h.record(job_id).preempted_count == count)

    @staticmethod
    def failures(job_id: str, count: int) -> Check:
        return Check(f"{job_id} failed {count}x", lambda h: h.record(job_id).failures == count)

    @staticmethod
    def reason(job_id: str, text: str) -> Check:
        """The job's statusReason contains ``text``."""
        return Check(f"{job_id} reason ~ {text!r}", lambda h: text in h.reason(job_id))

    @staticmethod
    def blocked(job_id: str, code: str | None) -> Check:
        return Expect.that(f"{job_id} blocked with {code}", lambda h: h.blocked(job_id) == code)

    @staticmethod
    def terminated(job_id: str) -> Check:
        return Check(f"{job_id} isTerminated", lambda h: h.terminated(job_id))

    @staticmethod
    def placement(job_id: str, *where: tuple[str, tuple[int, ...], tuple[int, ...]]) -> Check:
        """(node, slots, gpus) of the job's current attempt, in placement order."""
        return Check(f"{job_id} placed {where}", lambda h: h.placement(job_id) == list(where))

    @staticmethod
    def dispatch(job_id: str, phase: str, borrowed: int = 0) -> Check:
        """The job's latest dispatch happened in ``phase`` with ``borrowed`` instances borrowed."""
        return Check(
            f"{job_id} dispatched {phase} borrowing {borrowed}",
            lambda h: (h.dispatches(job_id)[-1].phase, h.dispatches(job_id)[-1].borrowed)
            == (phase, borrowed),
        )

    @staticmethod
    def dispatch_count(job_id: str, count: int) -> Check:
        return Check(f"{job_id} dispatched {count}x", lambda h: len(h.dispatches(job_id)) == count)

    @staticmethod
    def usage(share_name: str, count: int, unit: str = G5, queue: str = "jq") -> Check:
        return Check(f"U({share_name},{unit})={count}", lambda h: h.usage(share_name, unit, queue) == count)

    @staticmethod
    def last_events(*types: str) -> Check:
        """The ``type`` tags of the last input's events."""
        return Check(f"last events {types}", lambda h: tuple(e.type for e in h.last) == types)

    @staticmethod
    def share_gone(name: str, queue: str = "jq") -> Check:
        return Check(f"share {name} deleted", lambda h: (queue, name) not in h.state.shares)


expect = Expect()


@dataclass(frozen=True)
class Round:
    """The actions of one round and what must hold after it.

    ``want_preempted`` and ``want_rejected`` are about this round only and are always checked: the
    default (empty) means no preemption and no rejection happened in the round.
    """

    actions: Sequence[Step]
    want_status: Mapping[str, str] = field(default_factory=dict)
    want_preempted: Sequence[tuple[str, str, str]] = ()
    """(victim, preemptor, kind) of the round's JobPreempted events, in order."""
    want_reason: Mapping[str, str] = field(default_factory=dict)
    """``explain`` reason codes of named jobs."""
    want_rejected: Sequence[str] = ()
    """One substring per InputRejected event of the round, in order."""
    want_usage: Mapping[str, int] = field(default_factory=dict)
    """U(s, ml.g5.xlarge) per share of queue ``jq``."""
    want: Sequence[Check] = ()
    """Further named predicates over the harness."""


@dataclass(frozen=True)
class Case:
    rules: str
    """The semantics rules the case pins down (for the reader)."""
    setup: Callable[[], Harness]
    rounds: Sequence[Round]
