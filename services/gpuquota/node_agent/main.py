"""``gpuquota node-agent``: flags (or ``GPUQUOTA_*`` variables, see :class:`NodeAgentSettings`).

Flags override the environment. ``--check`` validates the configuration, discovers the slots and
prints the node as JSON. Otherwise the agent runs until SIGTERM/SIGINT, talking to the scheduler over
Kafka (``gpuquota.node_agent.kafka_link``). The embedded ``gpuquota up`` builds a
:class:`~gpuquota.node_agent.NodeAgent` directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuquota.settings import NodeAgentSettings
    from gpuquota.wire.base import SlotOffer

NOT_IMPLEMENTED = 2

#: flag dest -> settings field
_FLAGS = {
    "kafka": "kafka",
    "node_id": "node_id",
    "pool": "pool",
    "gpus": "gpus",
    "slots": "slots",
    "runtime": "runtime",
    "work_dir": "data_dir",
    "heartbeat_seconds": "heartbeat_seconds",
    "preemption_grace": "preemption_grace",
    "log_level": "log_level",
}


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--kafka", help="Kafka bootstrap servers host:port[,...] (GPUQUOTA_KAFKA)")
    add("--node-id", help="this node's id (GPUQUOTA_NODE_ID)")
    add("--pool", help="GPU pool (GPUQUOTA_POOL, default 'default')")
    add("--gpus", help="GPUs when --slots is unset (GPUQUOTA_GPUS, default 1)")
    add("--slots", help='offered instances, e.g. "ml.g5.xlarge=3,ml.p4d.24xlarge=1" (GPUQUOTA_SLOTS)')
    add("--runtime", help="process or simulated (GPUQUOTA_RUNTIME, default process)")
    add("--work-dir", help="logs, checkpoints and state.json (GPUQUOTA_DATA_DIR, default .gpuquota)")
    add("--heartbeat-seconds", help="heartbeat period (GPUQUOTA_HEARTBEAT_SECONDS, default 5)")
    add("--preemption-grace", help="seconds from SIGTERM to SIGKILL (GPUQUOTA_PREEMPTION_GRACE, default 30)")
    add("--log-level", help="DEBUG, INFO, WARNING or ERROR (GPUQUOTA_LOG_LEVEL)")
    add("--check", action="store_true", help="validate the configuration, print the node as JSON, exit")


def settings_environ(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    from gpuquota.settings import env_var

    merged = dict(environ)
    for dest, field in _FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            merged[env_var(field)] = str(value)
    return merged


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    from gpuquota.node_agent.slots import SlotSpecError, discover_slots
    from gpuquota.settings import NodeAgentSettings, SettingsError

    prog = "gpuquota node-agent"
    try:
        settings = NodeAgentSettings.from_env(
            settings_environ(args, os.environ if environ is None else environ)
        )
        slots = discover_slots(configured=settings.slot_spec)
    except (SettingsError, SlotSpecError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "check", False):
        node = {
            "node_id": settings.node_id,
            "pool": settings.pool,
            "runtime": settings.runtime_kind,
            "work_dir": str(settings.data_dir),
            "heartbeat_seconds": settings.heartbeat_seconds,
            "preemption_grace": settings.preemption_grace,
            "slots": [s.model_dump() for s in slots],
        }
        print(json.dumps(node, indent=2))
        return 0
    return _serve(settings, slots)


def _serve(settings: NodeAgentSettings, slots: tuple[SlotOffer, ...]) -> int:
    """Run the agent over Kafka until SIGTERM/SIGINT."""
    from gpuquota.adapters.kafka import KafkaTopics
    from gpuquota.distributed import NodeAgentService, configure_logging, serve
    from gpuquota.node_agent import make_runtime

    configure_logging(settings.log_level)

    async def main() -> int:
        service = NodeAgentService(
            settings.kafka,
            settings.node_id,
            settings.pool,
            slots,
            make_runtime(settings.runtime_kind),
            settings.data_dir,
            topics=KafkaTopics(settings.topic_prefix),
            heartbeat_seconds=settings.heartbeat_seconds,
            preemption_grace=settings.preemption_grace,
        )
        ready = f"gpuquota node-agent {settings.node_id} ready"
        return await serve(service.start, service.stop, ready)

    try:
        return asyncio.run(main())
    except OSError as exc:  # e.g. DirectoryInUse: another agent works in this directory
        print(f"gpuquota node-agent: {exc}", file=sys.stderr)
        return 1
