"""Runs an attempt's command and records how it ended, so that the outcome survives the node agent.

``python exit_wrapper.py EXIT_FILE COMMAND [ARG...]``. The process runtime starts every attempt
through this script (as the leader of the attempt's process group) where the C wrapper with the same
contract, ``exit_wrapper.c``, is not built (``gpuquota.node_agent.native_wrapper``). It writes its pid
to ``EXIT_FILE.pid``, runs the command as its child (same group, working directory, environment and
output), waits for it, and writes ``{"exit_code": N}`` or ``{"signal": N}`` to ``EXIT_FILE``
(atomically; ``{"exit_code": 127, "error": "..."}`` when the command cannot start), then ends the
same way as the command (it re-raises the signal), so an agent that is still its parent sees the
usual exit status. A restarted agent, which is not the parent any more, reads ``EXIT_FILE`` instead
(``gpuquota.node_agent.runtime.read_exit``).

SIGTERM, SIGINT and SIGHUP reach the whole group; the wrapper only waits for the command to react.
The script imports nothing from gpuquota (nor json, nor subprocess) and runs with ``-I -S``: it costs a
few milliseconds.
"""

from __future__ import annotations

import _signal as signal  # type: ignore[import-not-found]  # C module: ``signal`` imports enum
import os
import sys

# Only what the interpreter loaded at start-up (and _signal, built in): importing json, subprocess and
# signal's enums tripled the wrapper's CPU, which a node starting a hundred short attempts a second pays.
_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)
"""Python ignores these at start-up; the command gets them back at their defaults (as ``subprocess``)."""


def _write(path: str, doc: dict[str, int | str]) -> None:
    if "error" in doc:
        import json  # the rare path only

        text = json.dumps(doc)
    else:
        text = "{" + ", ".join(f'"{key}": {value}' for key, value in doc.items()) + "}"
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    exit_path, command = argv[0], argv[1:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the command gets the defaults
    with open(f"{exit_path}.pid", "w") as out:
        out.write(str(os.getpid()))
    try:
        # posix_spawnp reports a failed exec here, as subprocess does (glibc's spawn uses vfork)
        child = os.posix_spawnp(command[0], command, os.environ, setsigdef=_RESTORED)
    except OSError as exc:
        _write(exit_path, {"exit_code": 127, "error": str(exc)})
        return 127
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])  # waitpid retries after a signal (PEP 475)
    if code < 0:
        _write(exit_path, {"signal": -code})
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # SIGPIPE, SIGXFSZ: Python ignores them
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # the signal was blocked or ignored: end with the shell's convention
    _write(exit_path, {"exit_code": code})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
