"""Which exit wrapper the process runtime starts attempts through, and the build of the C one.

``exit_wrapper.c`` and ``exit_wrapper.py`` keep one contract (see either's opening comment). The C one
costs a fork and an exec per attempt, the Python one a Python interpreter's start-up (about 3 ms of
CPU: at a hundred starts a second, a third of a core). Measured in alternating runs of
``benchmarks.throughput --slots 64 --jobs 500 --duration 0.5`` on a loaded host (calibration 152-476
ms), two pairs, 2026-12-03: the jobs' own CPU 14.6-15.0 -> 3.3-3.4 ms per job, 37.6-41.2 -> 54.9-77.8
starts/s. ``make native`` (``python -m
gpuquota.entrypoints.build_native``) compiles the C one with the system C compiler (``$CC``, else ``cc``, else
``gcc``) into ``_compiled/exit-wrapper`` beside this module (not tracked by git), with the digest of
its source; without a compiler the build says so and the Python one runs. A build whose source has
changed since is never used (as for the compiled core).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "exit_wrapper.c"
PYTHON_WRAPPER = HERE / "exit_wrapper.py"
COMPILED = HERE / "_compiled"
BINARY = COMPILED / "exit-wrapper"
DIGEST_FILE = COMPILED / "exit-wrapper.sha256"
CFLAGS = ("-O2", "-Wall", "-Wextra")


def python_command() -> tuple[str, ...]:
    """The Python wrapper, as the runtime runs it (no site, no user environment: the cheapest start)."""
    return (sys.executable, "-I", "-S", str(PYTHON_WRAPPER))


def native_command() -> tuple[str, ...] | None:
    """The compiled wrapper when it was built from the current source; None otherwise."""
    try:
        current = DIGEST_FILE.read_text().strip() == source_digest()
    except OSError:
        return None
    return (str(BINARY),) if current and os.access(BINARY, os.X_OK) else None


# measured: jobs' CPU 14.8 -> 3.35 ms/job, 39 -> 66 starts/s on benchmarks.throughput, Python->C (2026-12-03)
def command() -> tuple[str, ...]:
    """The wrapper to start attempts through (followed by the exit file and the command)."""
    return native_command() or python_command()


def source_digest() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    return digest.hexdigest()


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and (path := shutil.which(name)):
            return path
    return None


def build(quiet: bool = False) -> int:
    """Compiles ``exit_wrapper.c`` (skipped when current); 1 when it cannot (the Python one runs)."""
    if native_command() is not None:
        if not quiet:
            print("compiled exit wrapper is current")
        return 0
    cc = compiler()
    if cc is None:
        print("no C compiler (cc, gcc, $CC): the Python exit wrapper will run", file=sys.stderr)
        return 1
    COMPILED.mkdir(exist_ok=True)
    # built beside its final place and renamed: an agent starting an attempt meanwhile runs either one
    fd, tmp = tempfile.mkstemp(prefix=".exit-wrapper-", dir=COMPILED)
    os.close(fd)
    try:
        done = subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"cannot build the exit wrapper ({cc}):\n{done.stderr}", file=sys.stderr)
            return 1
        os.chmod(tmp, 0o755)
        os.replace(tmp, BINARY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    DIGEST_FILE.write_text(source_digest() + "\n")
    print(f"compiled exit wrapper written to {BINARY}")
    return 0
