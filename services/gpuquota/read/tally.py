"""Counters of the decided events, folded with the read model (the Prometheus counters of I7).

Theory of operation
-------------------
The read model calls :meth:`EventTally.observe` with each event it applies and the job view the event
concerns; the tally adds to a few dictionaries (no Prometheus object on the hot path but the latency
histogram). So the counters describe the whole log and are rebuilt with it: ``ReadModel.reset`` starts
a new tally before the log is folded again. The tally is a Prometheus ``Collector``: the operator's
side (``gpuquota.observe.metrics``) registers it with the gauges it reads at scrape time, and lists
its metrics (:data:`TALLY_METRICS`) with its own in one catalogue, ``METRICS``.

It lives with the read model, not with the metrics, because the read model owns it: the read side
must not depend on the operator's side that reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, cast

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuquota.wire import events as ev

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

TALLY_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # name (without _total for counters): (type, labels, help), as ``observe.metrics.METRICS``
    "gpuquota_jobs_submitted": ("counter", ("queue", "share"), "Jobs accepted"),
    "gpuquota_dispatches": ("counter", ("phase",), "Attempts dispatched, by phase (IN_QUOTA, BORROW, HOLD)"),
    "gpuquota_preemptions": ("counter", ("kind",), "Attempts preempted, by kind"),
    "gpuquota_preempted_gpu_seconds": (
        "counter",
        ("queue", "share", "kind"),
        "Work lost to preemption (S10.3), by the victim's share and the kind: the victim attempt's "
        "runtime times its instances (GPU-seconds as gpuquota simulate counts them)",
    ),
    "gpuquota_preemption_lost_gpu_seconds": (
        "counter",
        ("queue", "share", "kind"),
        "Work thrown away by preemption (S12), by the victim's share and the kind: per victim attempt, "
        "its GPUs times the time since its last checkpoint (since it started without one)",
    ),
    "gpuquota_jobs_succeeded": ("counter", ("queue", "share"), "Jobs that succeeded"),
    "gpuquota_jobs_failed": (
        "counter",
        ("queue", "share", "reason_class"),
        "Jobs that failed: error, timeout, terminated or preempted",
    ),
    "gpuquota_rejections": ("counter", ("input_type",), "Inputs the scheduler rejected"),
    "gpuquota_submit_to_start_seconds": (
        "histogram",
        (),
        "From submission to the first attempt RUNNING",
    ),
}


class CountedJob(Protocol):
    """What the tally reads of the job an event concerns (the read model's ``JobView``)."""

    @property
    def count(self) -> int: ...

    @property
    def created_at(self) -> int: ...

    @property
    def share(self) -> tuple[str, str]: ...

    @property
    def attempts(self) -> Sequence[object]: ...


def _counter(name: str) -> CounterMetricFamily:
    kind, labels, doc = TALLY_METRICS[name]
    assert kind == "counter", name
    return CounterMetricFamily(name, doc, labels=labels)


def failure_class(event: ev.JobFailed) -> str:
    """The bounded ``reason_class`` of a failure (the reason text itself is unbounded)."""
    if event.preempted:
        return "preempted"
    if event.is_terminated:
        return "terminated"
    reason = event.status_reason.lower()
    if "duration" in reason or "timeout" in reason or "time limit" in reason:
        return "timeout"
    return "error"


def lost_gpu_seconds(event: ev.JobPreempted, victim: CountedJob) -> float:
    """S10.3's work lost by one preemption: the attempt's runtime times its instances."""
    return event.victim_runtime_ms / 1000 * victim.count


def checkpoint_lost_gpu_seconds(event: ev.JobPreempted) -> float:
    """S12's work lost by one preemption: the victim's GPUs times the time since its last checkpoint."""
    return event.lost_ms / 1000 * event.lost_gpus


class EventTally(Collector):
    """Counters of the events the read model applied (``ReadModel.apply`` calls :meth:`observe`)."""

    def __init__(self) -> None:
        # per metric, per tuple of label values
        self.submitted: Counter[tuple[str, ...]] = Counter()
        self.dispatched: Counter[tuple[str, ...]] = Counter()
        self.preempted: Counter[tuple[str, ...]] = Counter()
        self.lost: dict[tuple[str, ...], float] = {}
        self.lost_since_checkpoint: dict[tuple[str, ...], float] = {}
        self.succeeded: Counter[tuple[str, ...]] = Counter()
        self.failed: Counter[tuple[str, ...]] = Counter()
        self.rejected: Counter[tuple[str, ...]] = Counter()
        name = "gpuquota_submit_to_start_seconds"
        self.latency = Histogram(name, TALLY_METRICS[name][2], buckets=LATENCY_BUCKETS, registry=None)

    def observe(self, event: ev.SchedulerEvent, job: CountedJob | None) -> None:
        # Dispatch on the type's name: every event passes here, and ``isinstance`` on a pydantic model
        # goes through ``ABCMeta`` (a microsecond per miss on this machine).
        kind = event.type
        if kind not in _COUNTED:
            return
        if kind == "InputRejected":
            self.rejected[(cast(ev.InputRejected, event).input_type,)] += 1
        elif kind == "JobDispatched":
            self.dispatched[(cast(ev.JobDispatched, event).phase,)] += 1
        elif kind == "JobPreempted":
            preempted = cast(ev.JobPreempted, event)
            self.preempted[(preempted.kind,)] += 1
            if job is not None:
                key = (*job.share, preempted.kind)
                self.lost[key] = self.lost.get(key, 0.0) + lost_gpu_seconds(preempted, job)
                since = self.lost_since_checkpoint
                since[key] = since.get(key, 0.0) + checkpoint_lost_gpu_seconds(preempted)
        elif job is not None:
            if kind == "JobAccepted":
                self.submitted[job.share] += 1
            elif kind == "JobSucceeded":
                self.succeeded[job.share] += 1
            elif kind == "JobFailed":
                self.failed[(*job.share, failure_class(cast(ev.JobFailed, event)))] += 1
            elif len(job.attempts) == 1:  # JobRunning of the first attempt
                self.latency.observe(max(0.0, (event.occurred_at - job.created_at) / 1000))

    def collect(self) -> Iterator[Metric]:
        tables: tuple[tuple[str, Mapping[tuple[str, ...], float]], ...] = (
            ("gpuquota_jobs_submitted", self.submitted),
            ("gpuquota_dispatches", self.dispatched),
            ("gpuquota_preemptions", self.preempted),
            ("gpuquota_preempted_gpu_seconds", self.lost),
            ("gpuquota_preemption_lost_gpu_seconds", self.lost_since_checkpoint),
            ("gpuquota_jobs_succeeded", self.succeeded),
            ("gpuquota_jobs_failed", self.failed),
            ("gpuquota_rejections", self.rejected),
        )
        for name, counts in tables:
            metric = _counter(name)
            for key, value in sorted(counts.items()):
                metric.add_metric(list(key), value)
            yield metric
        yield from self.latency.collect()


_COUNTED = frozenset(
    {
        "InputRejected",
        "JobDispatched",
        "JobPreempted",
        "JobAccepted",
        "JobSucceeded",
        "JobFailed",
        "JobRunning",
    }
)
