# PYTHON_ARGCOMPLETE_OK
"""``gpuquota`` command line: a thin dispatcher to the service entry points.

Subcommands: ``version``, ``completion``, ``gateway``, ``scheduler``, ``node-agent``, ``up``, ``demo``, and
the client commands ``apply``, ``jobs``, ``shares``, ``queues``, ``nodes``, ``plans``, ``explain``
(:mod:`gpuquota.ctl`). Services read their configuration from ``GPUQUOTA_*`` environment variables
(see :mod:`gpuquota.config.settings`), not from flags. Usage errors exit 2 (argparse's convention), failures
1; ``docs/cli.md`` embeds every ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpuquota import __version__

Handler = Callable[[argparse.Namespace], int]


def _version(_: argparse.Namespace) -> int:
    print(f"gpuquota {__version__}")
    return 0


def _completion(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    print(shellcode(["gpuquota"], shell=args.shell), end="")
    return 0


def _completion_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")


def _gateway(args: argparse.Namespace) -> int:
    from gpuquota.entrypoints.serve import run_gateway

    return run_gateway(
        auth_keys=args.auth_keys,
        allow_unauthenticated=args.allow_unauthenticated,
        allowed_hosts=args.allowed_hosts,
        allowed_origins=args.allowed_origins,
    )


def _gateway_arguments(parser: argparse.ArgumentParser) -> None:
    from gpuquota.gateway.auth import add_auth_keys
    from gpuquota.gateway.browser_guard import add_browser_flags

    add_auth_keys(parser)
    add_browser_flags(parser)


def _scheduler(args: argparse.Namespace) -> int:
    from gpuquota.entrypoints.serve import run_scheduler

    return run_scheduler(metrics_port=args.metrics_port)


def _scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    help_text = "serve /metrics and /health/* on this port (GPUQUOTA_METRICS_PORT)"
    parser.add_argument("--metrics-port", type=int, default=None, help=help_text)


def _demo(args: argparse.Namespace) -> int:
    from gpuquota.ctl.demo import run_demo
    from gpuquota.entrypoints.demo_stack import BackgroundStack

    return run_demo(args, BackgroundStack)


def _imported(module: str, name: str) -> Callable[[Any], Any]:
    """``module.name``, imported when called: ``gpuquota --help`` and each command import only what
    they use."""

    def call(argument: Any) -> Any:
        return getattr(importlib.import_module(module), name)(argument)

    return call


def _client(name: str, module: str = "gpuquota.ctl.commands") -> Handler:
    """A client command (``<name>_command`` of ``module``), run with error handling (``commands.run``)."""

    def handler(args: argparse.Namespace) -> int:
        from gpuquota.ctl import commands

        return commands.run(getattr(importlib.import_module(module), f"{name}_command"), args)

    return handler


def _sim(name: str) -> Handler:
    """A local command of :mod:`gpuquota.sim.commands` (``<name>_command``): no gateway needed."""

    def handler(args: argparse.Namespace) -> int:
        from gpuquota.sim import commands

        return commands.guarded(getattr(commands, f"{name}_command"), name)(args)

    return handler


#: subcommand -> (help, handler); extend by replacing the handler of a command.
COMMANDS: dict[str, tuple[str, Handler]] = {
    "version": ("print the version and exit", _version),
    "completion": ("print the shell completion script (eval it in ~/.bashrc or ~/.zshrc)", _completion),
    "gateway": ("run the HTTP gateway (GPUQUOTA_* env vars)", _gateway),
    "scheduler": ("run the Kafka scheduler (GPUQUOTA_* env vars)", _scheduler),
    "node-agent": (
        "run the agent of one GPU node (flags or GPUQUOTA_* env vars)",
        _imported("gpuquota.entrypoints.node_agent", "run"),
    ),
    "up": (
        "run a whole local deployment in one process",
        _imported("gpuquota.entrypoints.embedded", "run_up"),
    ),
    "demo": (
        "run the worked example (S8) end to end and draw its timeline",
        _demo,
    ),
    "apply": ("create or update policy, environment, queue and quota shares from YAML", _client("apply")),
    "jobs": ("submit, list, describe, reprioritise or terminate jobs; read their logs", _client("jobs")),
    "shares": (
        "show quota shares: limits, usage, borrowed, lent, queued; disable, enable or delete one",
        _client("shares"),
    ),
    "queues": ("list job queues; disable, enable or delete one", _client("queues", "gpuquota.ctl.manage")),
    "nodes": (
        "list nodes (slots, GPUs, attempts, heartbeat); drain or undrain one",
        _client("nodes", "gpuquota.ctl.nodes"),
    ),
    "plans": (
        "list training plans (windows, allocations, used and idle GPU-hours); delete one",
        _client("plans", "gpuquota.ctl.plans"),
    ),
    "explain": ("explain why a job waits or was preempted", _client("explain")),
    "env": (
        'print the shell set-up of boto3 and the SageMaker SDK for this stack: eval "$(gpuquota env)"',
        _imported("gpuquota.ctl.env", "run_env"),
    ),
    "simulate": ("replay a trace through the scheduler under several configurations", _sim("simulate")),
    "trace": ("generate a synthetic trace, or export one from a recorded log", _sim("trace")),
}

#: the long-running services: their process ends as soon as they have stopped (``startup.exit_process``)
SERVICES = frozenset({"gateway", "scheduler", "node-agent", "up"})

#: subcommand -> adds its flags to its parser
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "completion": _completion_arguments,
    "gateway": _gateway_arguments,
    "scheduler": _scheduler_arguments,
    "node-agent": _imported("gpuquota.entrypoints.node_agent", "configure"),
    "up": _imported("gpuquota.entrypoints.embedded", "configure_up"),
    "demo": _imported("gpuquota.ctl.demo", "configure_demo"),
    "apply": _imported("gpuquota.ctl.commands", "configure_apply"),
    "jobs": _imported("gpuquota.ctl.commands", "configure_jobs"),
    "shares": _imported("gpuquota.ctl.commands", "configure_shares"),
    "queues": _imported("gpuquota.ctl.manage", "configure_queues"),
    "nodes": _imported("gpuquota.ctl.nodes", "configure_nodes"),
    "plans": _imported("gpuquota.ctl.plans", "configure_plans"),
    "explain": _imported("gpuquota.ctl.commands", "configure_explain"),
    "env": _imported("gpuquota.ctl.env", "configure_env"),
    "simulate": _imported("gpuquota.sim.commands", "configure_simulate"),
    "trace": _imported("gpuquota.sim.commands", "configure_trace"),
}


def build_parser() -> argparse.ArgumentParser:
    from gpuquota.ctl.options import add_global

    parser = argparse.ArgumentParser(prog="gpuquota", description="Self-hosted GPU job scheduler.")
    parser.add_argument("--version", action="version", version=f"gpuquota {__version__}")
    add_global(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, _) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name in ARGUMENTS:
            ARGUMENTS[name](command_parser)
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Record in each (sub)command's defaults its own parser, so that a bad flag prints its usage."""
    parser.set_defaults(usage_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _remember_parsers(child)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, but unknown flags are reported by the subcommand that got them (its usage,
    exit 2), not by the top-level parser."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.usage_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parse(parser, argv)
    _, handler = COMMANDS[args.command]
    code = handler(args)
    if argv is None and args.command in SERVICES:  # the process's own command line: it ends here
        from gpuquota.observe.startup import exit_process

        exit_process(code)  # stopped and flushed: skip the interpreter's teardown (a slow exit)
    return code


if __name__ == "__main__":
    sys.exit(main())
