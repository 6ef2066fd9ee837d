"""The metrics and readiness of the scheduler and of a node agent, served on ``--metrics-port``.

The scheduler's figures: its step and append histograms, its pipeline's counters (decided inputs, dead
letters), the consumer lag per assigned partition (the broker's high-water mark less the next offset the
pool's log records), and the pool and node gauges of each pool state it holds. Ready: the event log and
the broker answer, and the service has started and not failed.

A node agent's: the slots it offers, its active attempts and failed sends. Ready: the broker answers,
and the agent is registered with the scheduler and its last send succeeded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import Metric

from gpuquota.observe.health import OpsServer, broker_probe, flag_probe, store_probe
from gpuquota.observe.metrics import FunctionCollector, family, new_registry, state_families

if TYPE_CHECKING:
    from gpuquota.node_agent import NodeAgent
    from gpuquota.scheduler.faust_app import SchedulerService


class NodeAgentService(Protocol):
    """What the ops port reads of a node-agent service (``entrypoints.distributed``)."""

    agent: NodeAgent


METRICS_HOST = "0.0.0.0"  # Prometheus and the kubelet scrape from other hosts
"""Where ``--metrics-port`` listens: all interfaces (only metrics and health are served there)."""


def scheduler_families(service: SchedulerService) -> Iterator[Metric]:
    pipeline = service.pipeline
    if pipeline is None:
        return
    decided = family("gpuquota_inputs_decided")
    decided.add_metric([], pipeline.stats.decided)
    dead = family("gpuquota_dead_letters")
    dead.add_metric([], pipeline.stats.dead_letters)
    yield from (decided, dead)
    yield from consumer_lag(service)
    now = time.time()
    for runtime in list(pipeline.runtimes.values()):
        yield from state_families(runtime.state, now)


def consumer_lag(service: SchedulerService) -> Iterator[Metric]:
    lag = family("gpuquota_consumer_lag_records")
    app, pipeline = service.app, service.pipeline
    if app is None or pipeline is None:
        yield lag
        return
    recorded: dict[tuple[str, int], int] = {}
    for runtime in list(pipeline.runtimes.values()):
        for tp, offset in runtime.positions.items():
            recorded[tp] = max(offset, recorded.get(tp, 0))
    try:
        assigned = sorted(app.consumer.assignment())
    except Exception:  # not connected (yet): no partitions to report
        assigned = []
    for tp in assigned:
        try:
            highwater = app.consumer.highwater(tp)
        except Exception:
            continue
        if highwater is None:
            continue
        lag.add_metric(
            [tp.topic, str(tp.partition)], max(0, highwater - recorded.get((tp.topic, tp.partition), 0))
        )
    yield lag


def scheduler_ops(service: SchedulerService, port: int, host: str = METRICS_HOST) -> OpsServer:
    registry = new_registry()
    registry.register(service.timings)
    registry.register(FunctionCollector(lambda: scheduler_families(service)))

    def running() -> str | None:
        if service.failure is not None:
            return f"failed: {service.failure!r}"
        if service.pipeline is None:
            return "starting"
        return None if service.pipeline.store_available else "retrying the event log"

    probes = {
        "eventLog": store_probe(lambda: service.store, service.config.default_pool),
        "broker": broker_probe(service.config.kafka),
        "scheduler": flag_probe(running),
    }
    return OpsServer(registry, probes, host, port)


def agent_families(service: NodeAgentService) -> Iterator[Metric]:
    agent = service.agent
    gpus = family("gpuquota_node_gpus")
    units: dict[str, int] = {}
    for slot in agent.slots:
        units[slot.unit] = units.get(slot.unit, 0) + 1
    for unit, count in sorted(units.items()):
        gpus.add_metric([agent.pool, agent.node_id, unit], count)
    active = family("gpuquota_agent_attempts_active")
    active.add_metric([agent.node_id], len(agent.active_attempts))
    failures = family("gpuquota_agent_send_failures")
    failures.add_metric([agent.node_id], agent.send_failures)
    moved, took = family("gpuquota_agent_transfer_bytes"), family("gpuquota_agent_transfer_seconds")
    store = agent.data.store
    for direction, (size, seconds) in sorted(store.moved.items() if store is not None else ()):
        moved.add_metric([agent.node_id, direction], size)
        took.add_metric([agent.node_id, direction], seconds)
    yield from (gpus, active, failures, moved, took)


def agent_ops(service: NodeAgentService, kafka: str, port: int, host: str = METRICS_HOST) -> OpsServer:
    registry = new_registry()
    registry.register(FunctionCollector(lambda: agent_families(service)))

    def connected() -> str | None:
        return (
            None if service.agent.connected else "not registered with the scheduler (or its last send failed)"
        )

    probes = {"broker": broker_probe(kafka), "scheduler": flag_probe(connected)}
    return OpsServer(registry, probes, host, port)
