"""Prometheus metrics (I7): computed at scrape time from what the services already hold.

Theory of operation
-------------------
The gauges (per share and unit, per pool, per node) are not updated on the hot path: a custom collector
reads the read model and the core's ``ClusterState`` when Prometheus scrapes. The counters are folded
from the scheduler's events by the read model's tally (``gpuquota.read.tally``), fed with each event it
applies (a few dictionary increments per event), so they describe the whole log and are rebuilt with it. Only
what cannot be derived afterwards is measured on the way, per batch and not per input: the scheduling
step time, the log append time and batch size (:class:`Timings`; the scheduler loop times its one
append path into it).

Every service has its own ``CollectorRegistry`` (``new_registry``), never the process-wide default, so
several stacks in one process (the tests) do not clash. Labels are bounded: queues, shares, units, pools,
nodes, partitions and a few fixed classes; never a job or attempt id. The names and labels are listed in
docs/operations.md (a test checks the table against :data:`METRICS`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuquota.read.shares import share_maximum, share_table
from gpuquota.read.tally import TALLY_METRICS
from gpuquota.wire.base import Strategy

if TYPE_CHECKING:
    from gpuquota.core.state import ClusterState
    from gpuquota.read.model import ReadModel

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

_SHARE_UNIT = ("queue", "share", "unit")
"""The labels of a share's figure in one capacity unit."""

METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # name (without _total for counters): (type, labels, help)
    "gpuquota_share_limit_instances": ("gauge", _SHARE_UNIT, "The share's limit L(s,u)"),
    "gpuquota_share_maximum_instances": (
        "gauge",
        _SHARE_UNIT,
        "The most the share may hold, M(s,u) (+Inf: unbounded borrowing)",
    ),
    "gpuquota_share_used_instances": (
        "gauge",
        _SHARE_UNIT,
        "Instances held by the share's SCHEDULED, STARTING and RUNNING jobs",
    ),
    "gpuquota_share_borrowed_instances": ("gauge", _SHARE_UNIT, "max(0, used - limit)"),
    "gpuquota_share_lent_instances": (
        "gauge",
        _SHARE_UNIT,
        "The share's idle instances other shares borrow (display figure of gpuquota shares)",
    ),
    "gpuquota_share_queued_jobs": ("gauge", _SHARE_UNIT, "RUNNABLE jobs of the share"),
    "gpuquota_share_running_jobs": (
        "gauge",
        _SHARE_UNIT,
        "Dispatched jobs of the share (SCHEDULED, STARTING or RUNNING)",
    ),
    "gpuquota_share_reserved_idle_instances": (
        "gauge",
        _SHARE_UNIT,
        "A RESERVE share's idle instances, which nobody else may use",
    ),
    "gpuquota_pool_capacity_slots": ("gauge", ("pool", "unit"), "Slots on online, non-draining nodes"),
    "gpuquota_pool_free_slots": ("gauge", ("pool", "unit"), "Free slots on online, non-draining nodes"),
    "gpuquota_node_up": ("gauge", ("pool", "node"), "1 when the node is online and not draining"),
    "gpuquota_node_gpus": ("gauge", ("pool", "node", "unit"), "Slots (GPUs) the node offers"),
    "gpuquota_node_heartbeat_age_seconds": (
        "gauge",
        ("pool", "node"),
        "Seconds since the scheduler last recorded a heartbeat of the node (it records one per quarter "
        "of the heartbeat timeout at most)",
    ),
    **TALLY_METRICS,
    "gpuquota_dead_letters": ("counter", (), "Input records sent to the dead-letter topic"),
    "gpuquota_inputs_decided": ("counter", (), "Inputs decided and recorded by the scheduler"),
    "gpuquota_scheduling_step_seconds": (
        "histogram",
        (),
        "Handling one batch of inputs: decide, record, publish",
    ),
    "gpuquota_log_append_seconds": ("histogram", (), "One append of a batch to the event log"),
    "gpuquota_log_append_batch_size": ("histogram", (), "Inputs per append to the event log"),
    "gpuquota_consumer_lag_records": (
        "gauge",
        ("topic", "partition"),
        "Input records of an assigned partition not yet decided",
    ),
    "gpuquota_agent_attempts_active": ("gauge", ("node",), "Attempts the node agent runs now"),
    "gpuquota_agent_send_failures": ("counter", ("node",), "Failed sends of the node agent to the scheduler"),
    "gpuquota_agent_transfer_bytes": (
        "counter",
        ("node", "direction"),
        "Bytes of the jobs' S3 transfers the node agent finished, by direction (download, upload)",
    ),
    "gpuquota_agent_transfer_seconds": (
        "counter",
        ("node", "direction"),
        "Seconds those S3 transfers took, by direction",
    ),
}


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=False)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in the Prometheus text format."""
    return generate_latest(registry)


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty family of a metric of :data:`METRICS` (its type, help and labels from there)."""
    kind, labels, doc = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def _histogram(name: str, buckets: Sequence[float]) -> Histogram:
    return Histogram(name, METRICS[name][2], buckets=buckets, registry=None)


# ----- gauges read at scrape time ---------------------------------------------------------------


class ShareCollector(Collector):
    """Per share and unit, per pool and per node, from a read model and (optionally) the core's state."""

    def __init__(
        self,
        read_model: ReadModel,
        state: Callable[[], ClusterState | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.read_model = read_model
        self.state = state
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        yield from self.share_families()
        state = self.state()
        if state is not None:
            yield from state_families(state, self.clock())
        yield from self.read_model.tally.collect()

    def share_families(self) -> Iterator[Metric]:
        rm = self.read_model
        names = (
            "limit_instances",
            "maximum_instances",
            "used_instances",
            "borrowed_instances",
            "lent_instances",
            "queued_jobs",
            "running_jobs",
            "reserved_idle_instances",
        )
        out = {name: family(f"gpuquota_share_{name}") for name in names}
        state = self.state()
        for row in share_table(rm):
            queue, share = row["jobQueue"], row["quotaShareName"]
            limits: dict[str, int] = row["limits"]
            usage: dict[str, int] = row["usage"]
            queued: Counter[str] = Counter(
                rm.jobs[key[2]].unit for key in rm.runnable.get((queue, share), ()) if key[2] in rm.jobs
            )
            record = None if state is None else state.shares.get((queue, share))
            for unit in sorted({*limits, *usage, *queued}):
                labels = [queue, share, unit]
                limit = limits.get(unit, 0)
                used = usage.get(unit, 0)
                out["limit_instances"].add_metric(labels, limit)
                most = share_maximum(rm, queue, share, unit)
                out["maximum_instances"].add_metric(labels, float("inf") if most is None else most)
                out["used_instances"].add_metric(labels, used)
                out["borrowed_instances"].add_metric(labels, row["borrowed"].get(unit, 0))
                out["lent_instances"].add_metric(labels, row["lent"].get(unit, 0))
                out["queued_jobs"].add_metric(labels, queued.get(unit, 0))
                running = 0 if record is None else len(record.dispatched.get(unit, ()))
                out["running_jobs"].add_metric(labels, running)
                idle = max(0, limit - used) if row["strategy"] == Strategy.RESERVE.value else 0
                out["reserved_idle_instances"].add_metric(labels, idle)
        yield from out.values()


def state_families(state: ClusterState, now: float) -> Iterator[Metric]:
    """Pool and node gauges of one pool's ``ClusterState`` (``now`` in seconds)."""
    capacity = family("gpuquota_pool_capacity_slots")
    free = family("gpuquota_pool_free_slots")
    for pool, units in sorted(state.pool_slots.items()):
        for unit, slots in sorted(units.items()):
            capacity.add_metric([pool, unit], slots)
            free.add_metric([pool, unit], state.pool_free.get(pool, {}).get(unit, 0))
    up = family("gpuquota_node_up")
    gpus = family("gpuquota_node_gpus")
    age = family("gpuquota_node_heartbeat_age_seconds")
    for node_id, node in sorted(state.nodes.items()):
        up.add_metric([node.pool, node_id], 1 if node.usable else 0)
        for unit, count in sorted(Counter(slot.unit for slot in node.slots).items()):
            gpus.add_metric([node.pool, node_id, unit], count)
        age.add_metric([node.pool, node_id], max(0.0, now - node.last_heartbeat / 1000))
    yield from (capacity, free, up, gpus, age)


# ----- measured on the way ----------------------------------------------------------------------


class Timings(Collector):
    """The scheduling step and log append histograms of one scheduler (per batch, never per input)."""

    def __init__(self) -> None:
        self.step = _histogram("gpuquota_scheduling_step_seconds", STEP_BUCKETS)
        self.append = _histogram("gpuquota_log_append_seconds", STEP_BUCKETS)
        self.batch = _histogram("gpuquota_log_append_batch_size", BATCH_BUCKETS)

    def appended(self, seconds: float, size: int) -> None:
        self.append.observe(seconds)
        self.batch.observe(size)

    def collect(self) -> Iterator[Metric]:
        for histogram in (self.step, self.append, self.batch):
            yield from histogram.collect()


class FunctionCollector(Collector):
    """Families produced by a function at scrape time (the scheduler's and node agent's own figures)."""

    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self.produce = produce

    def collect(self) -> Iterator[Metric]:
        yield from self.produce()
