"""``gpuquota node-agent``: flags (or ``GPUQUOTA_*`` variables, see :class:`NodeAgentSettings`).

Flags override the environment. ``--check`` validates the configuration, discovers the slots and
prints the node as JSON. Otherwise the agent runs until SIGTERM/SIGINT, talking to the scheduler over
Kafka (``gpuquota.node_agent.kafka_link``). The embedded ``gpuquota up`` builds a
:class:`~gpuquota.node_agent.NodeAgent` directly.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuquota.config.settings import NodeAgentSettings
    from gpuquota.wire.base import SlotOffer

#: flag -> help; each sets the settings field of its name (``--work-dir`` sets ``data_dir``)
_HELP = {
    "--kafka": "Kafka bootstrap servers host:port[,...] (GPUQUOTA_KAFKA)",
    "--node-id": "this node's id (GPUQUOTA_NODE_ID)",
    "--pool": "GPU pool (GPUQUOTA_POOL, default 'default')",
    "--gpus": "GPUs when --slots is unset (GPUQUOTA_GPUS, default 1)",
    "--slots": 'offered instances, e.g. "ml.g5.xlarge=3,ml.p4d.24xlarge=1" (GPUQUOTA_SLOTS)',
    "--runtime": "process, simulated or container (GPUQUOTA_RUNTIME, default process)",
    "--container-engine": "podman or docker (GPUQUOTA_CONTAINER_ENGINE, default: the first found)",
    "--work-dir": "logs, checkpoints and state.json (GPUQUOTA_DATA_DIR, default .gpuquota)",
    "--heartbeat-seconds": "heartbeat period (GPUQUOTA_HEARTBEAT_SECONDS, default 5)",
    "--preemption-grace": "seconds from SIGTERM to SIGKILL (GPUQUOTA_PREEMPTION_GRACE, default 30)",
    "--logs-port": "serve attempt logs to the gateway on this port (GPUQUOTA_LOGS_PORT, 0: off)",
    "--logs-host": "bind address of the log server (GPUQUOTA_LOGS_HOST, default 0.0.0.0)",
    "--node-token-file": "the token the gateway must show the log server (GPUQUOTA_NODE_TOKEN_FILE)",
    "--log-level": "DEBUG, INFO, WARNING or ERROR (GPUQUOTA_LOG_LEVEL)",
    "--metrics-port": "serve /metrics and /health/* on this port (GPUQUOTA_METRICS_PORT)",
    "--advertise-address": "how other nodes reach this one (GPUQUOTA_ADVERTISE_ADDRESS, default: host name)",
    "--training-plan": "the training plan this node belongs to: its slots are used only in the plan's "
    "windows (GPUQUOTA_TRAINING_PLAN)",
}
#: flag dest -> settings field
_FLAGS = {dest: dest for dest in (flag[2:].replace("-", "_") for flag in _HELP)}
_FLAGS["work_dir"] = "data_dir"
_FLAGS["allow_unauthenticated"] = "allow_unauthenticated"


def configure(parser: argparse.ArgumentParser) -> None:
    for flag, text in _HELP.items():
        parser.add_argument(flag, help=text)
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,  # unset: GPUQUOTA_ALLOW_UNAUTHENTICATED decides
        help="serve the log server off loopback without a node token (GPUQUOTA_ALLOW_UNAUTHENTICATED=1)",
    )
    parser.add_argument(
        "--check", action="store_true", help="validate the configuration, print the node as JSON, exit"
    )


def settings_environ(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    from gpuquota.config.environ import env_var

    merged = dict(environ)
    for dest, field in _FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            merged[env_var(field)] = str(value)
    return merged


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    from gpuquota.config.environ import SettingsError, forget_secrets
    from gpuquota.config.settings import NodeAgentSettings
    from gpuquota.node_agent.slots import SlotSpecError, discover_slots
    from gpuquota.observe.startup import warn_unknown_variables
    from gpuquota.support.exposure import TokenError, read_token

    prog = "gpuquota node-agent"
    env = os.environ if environ is None else environ
    warn_unknown_variables(prog, env)
    try:
        settings = NodeAgentSettings.from_env(settings_environ(args, env))
        slots = discover_slots(configured=settings.slot_spec)
        token = read_token(settings.node_token, settings.node_token_file)
    except (SettingsError, SlotSpecError, TokenError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if environ is None:
        forget_secrets(os.environ)  # read: the jobs this agent starts do not inherit them
    if getattr(args, "check", False):
        try:
            _check_log_server(settings, token)
        except ValueError as exc:  # Exposed
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        node = {
            "node_id": settings.node_id,
            "pool": settings.pool,
            "runtime": settings.runtime_kind,
            "container_engine": settings.container_engine,
            "work_dir": str(settings.data_dir),
            "address": settings.advertise_address or socket.gethostname(),
            "heartbeat_seconds": settings.heartbeat_seconds,
            "preemption_grace": settings.preemption_grace,
            "slots": [s.model_dump() for s in slots],
            "training_plan": settings.training_plan,
        }
        print(json.dumps(node, indent=2))
        return 0
    return _serve(settings, slots, token)


def _check_log_server(settings: NodeAgentSettings, token: str | None) -> None:
    """The loopback rule for the log server (``gpuquota.support.exposure``): raises ``Exposed``."""
    from gpuquota.support.exposure import TOKEN_FILE_ENV, check_exposure

    if settings.logs_port:
        give = f"--node-token-file FILE or {TOKEN_FILE_ENV}=FILE (the gateway's too)"
        check_exposure(
            "attempt logs", settings.logs_host, token is not None, settings.allow_unauthenticated, give
        )


def _serve(settings: NodeAgentSettings, slots: tuple[SlotOffer, ...], token: str | None) -> int:
    """Run the agent over Kafka until SIGTERM/SIGINT."""
    from gpuquota.adapters.kafka import KafkaTopics
    from gpuquota.entrypoints.distributed import NodeAgentService
    from gpuquota.entrypoints.metrics_port import agent_ops
    from gpuquota.entrypoints.serve import configure_logging, serve
    from gpuquota.node_agent import make_runtime
    from gpuquota.node_agent.s3_stage import data_plane
    from gpuquota.observe.logs import bind
    from gpuquota.observe.startup import run_service, wait_for_dependencies

    configure_logging(settings.log_level, settings.log_format)
    bind(node_id=settings.node_id)
    prog = "gpuquota node-agent"
    try:
        _check_log_server(settings, token)  # logged after configure_logging: the override's warning
        runtime = make_runtime(settings.runtime_kind, settings.container_engine, settings.image_map)
    except ValueError as exc:  # Exposed, or no container engine
        print(f"gpuquota node-agent: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        await wait_for_dependencies(prog, settings.startup_timeout, settings.kafka)
        service = NodeAgentService(
            settings.kafka,
            settings.node_id,
            settings.pool,
            slots,
            runtime,
            settings.data_dir,
            topics=KafkaTopics(settings.topic_prefix),
            heartbeat_seconds=settings.heartbeat_seconds,
            preemption_grace=settings.preemption_grace,
            logs_port=settings.logs_port or None,
            logs_host=settings.logs_host,
            logs_token=token,
            address=settings.advertise_address or socket.gethostname(),
            kafka_security=settings.kafka_security,
            data=data_plane(settings),
            training_plan=settings.training_plan,
        )
        port = settings.metrics_port
        ops = None if port is None else agent_ops(service, settings.kafka, port)

        async def start() -> None:
            if ops is not None:
                await ops.start()
            await service.start()

        async def stop() -> None:
            await service.stop()
            if ops is not None:
                await ops.stop()

        ready = f"gpuquota node-agent {settings.node_id} ready"
        return await serve(start, stop, ready)

    return run_service(prog, main)
