"""The options every client command takes: ``--endpoint`` and ``--output``.

They are accepted both before the subcommand (``gpuquota -o json shares``, :func:`add_global`) and
after it (``gpuquota shares -o json``, :func:`add_common`). Every command module adds them from here,
so none of them imports another command module to get them.
"""

from __future__ import annotations

import argparse

ENDPOINT_HELP = "gateway URL (default $GPUQUOTA_ENDPOINT or http://127.0.0.1:8642)"
OUTPUT_HELP = "output format (default table)"


def add_global(parser: argparse.ArgumentParser) -> None:
    """``--endpoint`` and ``--output`` on the top-level parser: ``gpuquota -o json shares`` works."""
    parser.add_argument("--endpoint", default=None, help=ENDPOINT_HELP)
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help=OUTPUT_HELP)


def add_common(parser: argparse.ArgumentParser) -> None:
    """The same options after the subcommand; ``SUPPRESS`` keeps a value given before it."""
    parser.add_argument("--endpoint", default=argparse.SUPPRESS, help=ENDPOINT_HELP)
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default=argparse.SUPPRESS, help=OUTPUT_HELP
    )
