"""Replacing a file whole without making or freeing an inode: ``renameat2(RENAME_EXCHANGE)``.

A file written to ``PATH.tmp`` and renamed over ``PATH`` is atomic, but every write makes one inode
(the new file) and frees one (the old ``PATH``). On ext4 without a journal (the development
machine's disk) each new inode then skips, one buffer lookup each, every inode of its group freed in
the last minutes: the node agent's ``state.json``, rewritten about once per two attempts, made every
directory and file the launches made after it dearer, more so the longer the node ran (measured:
a directory 83-113 us of CPU, 215-425 us with one rename over a file per two directories made).

Here the new text is written into the spare file (kept from the last write) and the two names are
exchanged atomically: readers of ``PATH`` see the old file or the new one, never half of one, and
after the first write no inode is made or freed. Where the exchange is not supported (no
``renameat2``, another file system, or no ``PATH`` yet), it falls back to the rename.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import Any

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _renameat2() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # glibc before 2.28, another libc
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_EXCHANGE = _renameat2()


def exchange(first: Path, second: Path) -> bool:
    """Swaps the two names atomically; False where this cannot be done (nothing changed then)."""
    if _EXCHANGE is None:
        return False
    if _EXCHANGE(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(error, os.strerror(error), str(first), None, str(second))


def replace_text(path: Path, text: str) -> None:
    """Replaces ``path``'s content with ``text`` atomically (see the module's text); ``PATH.tmp``
    (``path.with_suffix(".tmp")``) is the spare, left holding the previous content."""
    spare = path.with_suffix(".tmp")
    spare.write_text(text)
    if not exchange(spare, path):
        os.replace(spare, path)
