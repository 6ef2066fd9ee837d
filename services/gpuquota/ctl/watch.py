"""``--watch`` on ``gpuquota jobs list``, ``shares`` and ``nodes``: run the command every ``--interval``
seconds and redraw its output in place (``rich.live``) on a terminal; elsewhere (a pipe, a file) print
each frame after a header line, and with ``-o json`` one compact JSON document per line. Ctrl-C stops
(exit 0); ``--frames N`` stops after N frames.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime

DEFAULT_INTERVAL = 2.0


def add_watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-w", "--watch", action="store_true", help="redraw every --interval seconds")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help=f"with --watch: seconds (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument("--frames", type=int, default=None, help="with --watch: stop after N frames")


def capture(command: Callable[[], int]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = command()
    return rc, out.getvalue()


def loop(command: Callable[[], int], args: argparse.Namespace) -> int:
    """Run ``command`` (which prints one frame) until Ctrl-C, ``--frames`` or a failure (its code)."""
    if args.interval <= 0:
        args.usage_parser.error("--interval must be > 0")
    title = "gpuquota " + " ".join(filter(None, (args.command, getattr(args, "jobs_command", None))))
    live = sys.stdout.isatty() and args.output != "json"
    frames = 0
    with _display(live) as show:
        try:
            while args.frames is None or frames < args.frames:
                rc, text = capture(command)
                if rc != 0:
                    return rc
                stamp = datetime.now().strftime("%H:%M:%S")
                if args.output == "json":
                    print(json.dumps(json.loads(text), sort_keys=True), flush=True)
                else:
                    show(f"Every {args.interval:g}s: {title}  {stamp}\n\n{text}")
                frames += 1
                if args.frames is None or frames < args.frames:
                    time.sleep(args.interval)
        except KeyboardInterrupt:
            pass
    return 0


@contextlib.contextmanager
def _display(live: bool) -> Iterator[Callable[[str], None]]:
    """``show(frame)``: in place on a terminal (rich keeps our ANSI colours), else printed in turn."""
    if not live:

        def show_plain(frame: str) -> None:
            print(frame, flush=True)

        yield show_plain
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    with Live(console=Console(), auto_refresh=False, vertical_overflow="visible") as screen:

        def show_live(frame: str) -> None:
            screen.update(Text.from_ansi(frame.rstrip("\n")), refresh=True)

        yield show_live
