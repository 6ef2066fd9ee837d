"""One writer per data directory: an exclusive ``fcntl`` lock on ``<dir>/LOCK`` held while a process runs.

``gpuquota up`` locks its ``--data-dir`` and every node agent its work directory. A second process on
the same directory gets :class:`DirectoryInUse` (``data dir ... is in use by pid N``) at once instead
of adopting the same processes and appending to the same log. The kernel drops the lock when its
holder dies, even by SIGKILL, so a crash never leaves the directory locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "LOCK"


class DirectoryInUse(OSError):
    """Another process holds the directory's lock (an ``OSError``: the commands report it as such)."""


class DirectoryLock:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).absolute()
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def acquire(self) -> None:
        """Takes the lock (raises :class:`DirectoryInUse` if another process holds it)."""
        if self._fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DirectoryInUse(f"data dir {self.directory} is in use by pid {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
