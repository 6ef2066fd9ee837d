"""Runs an attempt's command and records how it ended, so that the outcome survives the node agent.

``python exit_wrapper.py EXIT_FILE COMMAND [ARG...]``. The process runtime starts every attempt
through this script (as the leader of the attempt's process group) where the C wrapper with the same
contract, ``exit_wrapper.c``, is not built (``gpuquota.node_agent.native_wrapper``). It writes
``{"pid": N}`` (its own pid) to ``EXIT_FILE``, runs the command as its child (same group, working
directory, environment and output), waits for it, and replaces that record with ``{"exit_code": N}``
or ``{"signal": N}`` (``{"exit_code": 127, "error": "..."}`` when the command cannot start): in place,
one write at offset 0 padded with spaces to cover the pid record, so a reader finds one whole record
or the other. It then ends the same way as the command (it re-raises the signal), so an agent that is
still its parent sees the usual exit status. A restarted agent, which is not the parent any more,
reads ``EXIT_FILE`` instead (``gpuquota.node_agent.runtime.read_exit`` and ``wrapper_pid``).

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


class _Record:
    """``EXIT_FILE``: the pid record first, replaced by the outcome in one write at offset 0."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        self.covered = os.write(self.fd, f'{{"pid": {os.getpid()}}}'.encode())

    def write(self, doc: dict[str, int | str]) -> None:
        if "error" in doc:
            import json  # the rare path only

            text = json.dumps(doc)
        else:
            text = "{" + ", ".join(f'"{key}": {value}' for key, value in doc.items()) + "}"
        os.pwrite(self.fd, text.encode().ljust(self.covered), 0)
        os.close(self.fd)


def main(argv: list[str]) -> int:
    exit_path, command = argv[0], argv[1:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the command gets the defaults
    record = _Record(exit_path)
    try:
        # posix_spawnp reports a failed exec here, as subprocess does (glibc's spawn uses vfork)
        child = os.posix_spawnp(command[0], command, os.environ, setsigdef=_RESTORED)
    except OSError as exc:
        record.write({"exit_code": 127, "error": str(exc)})
        return 127
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])  # waitpid retries after a signal (PEP 475)
    if code < 0:
        record.write({"signal": -code})
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # SIGPIPE, SIGXFSZ: Python ignores them
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # the signal was blocked or ignored: end with the shell's convention
    record.write({"exit_code": code})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
