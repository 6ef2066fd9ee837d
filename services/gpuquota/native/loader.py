"""The scheduling core compiled to C with mypyc, used instead of its Python source when it is current.

Theory of operation
-------------------
``python -m gpuquota.entrypoints.build_native`` (``make native``; ``make test`` and ``make demo`` run it)
compiles the modules of ``gpuquota.core`` with mypyc, from the very same source files, into extension modules
under ``gpuquota/core/_compiled/``, and writes there the digest of the sources it compiled: the core's
and the wire contract's ``.py`` files, the Python version and the mypy version.

``install()`` runs when ``gpuquota`` is imported. If the digest of the current sources equals the
recorded one, it puts a finder in front of ``sys.meta_path`` that loads ``gpuquota.core.<module>`` from
the compiled directory; otherwise (never built, a source edited since, another Python, or
``GPUQUOTA_PURE_PYTHON=1``) nothing changes and the Python source runs. A stale build is therefore never
used: editing a core module falls back to Python until the next build. ``core_mode()`` says which one
runs and why.

The compiled core decides exactly what the Python core decides (same source; ``make test`` runs the
core's tests both ways). It is about twice as fast (measured below), and no C compiler is
needed to run gpuquota.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parents[1]
CORE = PACKAGE / "core"
COMPILED = CORE / "_compiled"
DIGEST_FILE = COMPILED / "SOURCES.sha256"
GROUP = "gpuquota_core_native"
"""mypyc's shared library for the whole core (one group: calls between modules stay C calls). It is a
top-level module: the modules' shims import it while ``gpuquota.core`` is still initialising."""
LIBRARY = GROUP + "__mypyc"
PURE_ENV = "GPUQUOTA_PURE_PYTHON"
BUILD_FORMAT = 1
"""Bump when ``gpuquota.entrypoints.build_native`` lays out or compiles the core differently."""

_mode = "python (not built: run `make native`)"


def core_modules() -> list[str]:
    """The compiled modules: every module of ``gpuquota.core`` except the package itself."""
    return sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")


def sources_digest() -> str:
    """What a build depends on: the core's and the wire contract's sources, Python and mypy versions."""
    digest = hashlib.sha256()
    digest.update(sys.version.encode())
    digest.update(_mypy_version().encode())
    digest.update(f"{GROUP} {BUILD_FORMAT}".encode())
    for path in sorted([*CORE.glob("*.py"), *(PACKAGE / "wire").glob("*.py")]):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _mypy_version() -> str:
    try:
        from importlib.metadata import version

        return version("mypy")
    except Exception:  # mypy is a build-time tool only: the installed one must match the build's
        return "none"


def extension_suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


class CompiledCoreFinder(importlib.abc.MetaPathFinder):
    """Finds ``gpuquota.core.<module>`` (and mypyc's shared library) in the compiled directory."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if not ((package == "gpuquota.core" and name in self.names) or fullname == LIBRARY):
            return None
        return importlib.util.spec_from_file_location(fullname, COMPILED / f"{name}{extension_suffix()}")


# measured: 2.91 -> 1.52 s CPU on benchmarks.core (N 10,000, 50,000 inputs), Python -> compiled (2026-12-03)
def install() -> None:
    """Use the compiled core if it was built from exactly the current sources (see the module doc)."""
    global _mode
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _mode = f"python ({PURE_ENV} is set)"
        return
    try:
        recorded = DIGEST_FILE.read_text().strip()
    except OSError:
        return
    if recorded != sources_digest():
        _mode = "python (the compiled core is older than the sources: run `make native`)"
        return
    names = {*core_modules(), LIBRARY}
    if not all((COMPILED / f"{name}{extension_suffix()}").exists() for name in names):
        _mode = "python (the compiled core is incomplete: run `make native`)"
        return
    sys.meta_path.insert(0, CompiledCoreFinder(names))
    _mode = "compiled"


def core_mode() -> str:
    """``compiled``, or ``python (why)``, as decided when ``gpuquota`` was imported."""
    return _mode
