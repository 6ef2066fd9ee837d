"""The node agent's children: started off the event loop, awaited without a thread each.

``asyncio.create_subprocess_exec`` forks on the loop's thread (with vfork the parent waits until the
child has exec'd, which on a busy machine is milliseconds: a wave of 64 launches held the loop about
half a second) and asyncio's default child watcher starts a thread per child to wait for it. Here
``subprocess.Popen`` runs on a launch thread (:func:`launcher`; the process runtime calls
:func:`start` there, with the rest of an instance's launch), and the exit is awaited through a pidfd
on the loop (Linux 5.3+; elsewhere polled), then reaped with ``Popen.wait``.

Commands (:func:`run`; the container engine's): their output goes to unnamed temporary files, read
once the command has exited. On uvloop's loop ``create_subprocess_exec`` gave the child every
inheritable descriptor and a second copy of each of its stdio pipes (uvloop has no ``close_fds``;
libuv leaves the originals open beside 0, 1 and 2), so ``podman run --detach`` handed our pipes to
the container's monitor (conmon), and reading them to their end waited until the container exited.
A command's end here is its exit, never its pipes' end, and ``Popen`` closes every other descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

#: threads of the launches and commands (mostly system calls: the GIL is free while they wait)
LAUNCH_THREADS = 4


class Child(subprocess.Popen[bytes]):
    """A child the agent may leave running on purpose (a stopping agent leaves its attempts to the next
    one): dropped while it runs, it is neither warned about nor handed to ``subprocess``'s reaper."""

    def __del__(self) -> None:
        if self.returncode is not None:
            super().__del__()


@functools.cache
def launcher() -> ThreadPoolExecutor:
    """The process's launch threads, made at its first launch and shared by its runtimes (an executor
    per runtime kept its idle threads for as long as the process lived)."""
    return ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="launch")


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


async def run(argv: list[str], timeout: float | None, poll_seconds: float = 0.05) -> tuple[int, str, str]:
    """Runs a command to its exit: (return code, stdout, stderr). Raises ``TimeoutError`` after
    ``timeout`` seconds (None: no limit), and kills the command then, or when cancelled."""
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = loop.run_in_executor(launcher(), functools.partial(_start_command, argv, out, err))
        try:
            child = await asyncio.shield(started)
        except asyncio.CancelledError:
            # cancelled while the thread starts it: the command exists once the start returns, and
            # nothing else holds it, so it is killed here rather than left running unreaped
            _kill(await started)
            raise
        try:
            code = await asyncio.wait_for(exited(child, poll_seconds), timeout)
        except BaseException:
            _kill(child)
            raise
        return code, _read(out), _read(err)


def _kill(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    child.wait()  # killed: at once


def _start_command(argv: list[str], out: IO[bytes], err: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True)


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


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
