"""The process runtime's own children: started off the event loop, awaited without a thread each.

``asyncio.create_subprocess_exec`` forks on the loop's thread (with vfork the parent waits until the
child has exec'd, which on a busy machine is milliseconds: a wave of 64 launches held the loop about
half a second) and asyncio's default child watcher starts a thread per child to wait for it. Here
``subprocess.Popen`` runs on a worker thread (the runtime calls :func:`start` there, with the rest of
an instance's launch), and the exit is awaited through a pidfd on the loop (Linux 5.3+; elsewhere
polled), then reaped with ``Popen.wait``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import IO


class Child(subprocess.Popen[bytes]):
    """A child the agent may leave running on purpose (a stopping agent leaves its attempts to the next
    one): dropped while it runs, it is neither warned about nor handed to ``subprocess``'s reaper."""

    def __del__(self) -> None:
        if self.returncode is not None:
            super().__del__()


def start(argv: tuple[str, ...], log: IO[bytes], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """Starts ``argv`` as the leader of a new session, output to ``log`` (raises like ``Popen``); blocks:
    call it off the loop."""
    return Child(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


async def exited(child: subprocess.Popen[bytes], poll_seconds: float) -> int:
    """The child's return code once it has exited (negative: the signal that ended it); reaps it."""
    if child.returncode is not None:
        return child.returncode
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):  # no pidfd here: poll
        while (code := child.poll()) is None:
            await asyncio.sleep(poll_seconds)
        return code
    try:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
    return child.wait()  # it has exited: this only reaps it


def _resolve(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
