"""``gpuquota`` command line: a thin dispatcher to the service entry points.

Subcommands: ``version``, ``gateway``, ``scheduler``, ``node-agent``, ``up``, ``demo``. Services
read their configuration from ``GPUQUOTA_*`` environment variables (see :mod:`gpuquota.settings`),
not from flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gpuquota import __version__

Handler = Callable[[argparse.Namespace], int]

NOT_IMPLEMENTED = 2


def _version(_: argparse.Namespace) -> int:
    print(f"gpuquota {__version__}")
    return 0


def _not_implemented(args: argparse.Namespace) -> int:
    print(f"gpuquota {args.command}: not implemented yet", file=sys.stderr)
    return NOT_IMPLEMENTED


#: subcommand -> (help, handler); extend by replacing the handler of a command.
COMMANDS: dict[str, tuple[str, Handler]] = {
    "version": ("print the version and exit", _version),
    "gateway": ("run the HTTP gateway (GPUQUOTA_* env vars)", _not_implemented),
    "scheduler": ("run the scheduler for one pool (GPUQUOTA_* env vars)", _not_implemented),
    "node-agent": ("run the agent of one GPU node (GPUQUOTA_* env vars)", _not_implemented),
    "up": ("run a whole local deployment in one process", _not_implemented),
    "demo": ("run the end-to-end demo", _not_implemented),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuquota", description="Self-hosted GPU job scheduler.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _, handler = COMMANDS[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
