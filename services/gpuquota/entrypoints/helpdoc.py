"""The ``--help`` of every ``gpuquota`` command, as embedded in docs/cli.md (a test keeps them equal).

``python -m gpuquota.entrypoints.helpdoc`` rewrites the section of docs/cli.md between the two markers below;
``--check`` exits 1 when it differs. Help is formatted 100 columns wide, whatever the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path

BEGIN = "<!-- BEGIN GENERATED HELP: python -m gpuquota.entrypoints.helpdoc -->"
END = "<!-- END GENERATED HELP -->"
WIDTH = "100"
DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it, depth first in declaration order."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from parsers(child)


def reference() -> str:
    """The generated section: one ``--help`` block per command, between the markers."""
    from gpuquota.entrypoints.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        blocks = [
            f"### `{p.prog}`\n\n```text\n{p.format_help().rstrip()}\n```" for p in parsers(build_parser())
        ]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join([BEGIN, "", "\n\n".join(blocks), "", END])


def embedded(text: str) -> str:
    """The generated section of ``text`` (docs/cli.md), markers included."""
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    return text[start:stop]


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    text = DOC.read_text()
    current, wanted = embedded(text), reference()
    if current == wanted:
        return 0
    if check:
        print(f"{DOC} is out of date: run python -m gpuquota.entrypoints.helpdoc", file=sys.stderr)
        return 1
    DOC.write_text(text.replace(current, wanted))
    print(f"rewrote the command reference in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
