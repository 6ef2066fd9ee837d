"""Runs an attempt's command and records how it ended, so that the outcome survives the node agent.

``python exit_wrapper.py EXIT_FILE COMMAND [ARG...]``. The process runtime starts every attempt
through this script (as the leader of the attempt's process group). It writes its pid to
``EXIT_FILE.pid``, runs the command as its child (same group, working directory, environment and
output), waits for it, and writes ``{"exit_code": N}`` or ``{"signal": N}`` to ``EXIT_FILE``
(atomically), then ends the same way as the command (it re-raises the signal), so an agent that is
still its parent sees the usual exit status. A restarted agent, which is not the parent any more,
reads ``EXIT_FILE`` instead (``gpuquota.node_agent.runtime.read_exit``).

SIGTERM, SIGINT and SIGHUP reach the whole group; the wrapper only waits for the command to react.
The script imports nothing from gpuquota and runs with ``-I -S``: it costs a few milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys


def _write(path: str, doc: dict[str, int | str]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(doc, out)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    exit_path, command = argv[0], argv[1:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the command gets the defaults
    with open(f"{exit_path}.pid", "w") as out:
        out.write(str(os.getpid()))
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        _write(exit_path, {"exit_code": 127, "error": str(exc)})
        return 127
    code = child.wait()
    if code < 0:
        _write(exit_path, {"signal": -code})
        if -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(-code, signal.SIG_DFL)  # the others still have their defaults
        os.kill(os.getpid(), -code)
        return 128 - code  # the signal was blocked or ignored: end with the shell's convention
    _write(exit_path, {"exit_code": code})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
