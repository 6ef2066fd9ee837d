"""``python -m gpuquota.entrypoints.build_native``: compile the scheduling core with mypyc (``make native``),
and the node agent's exit wrapper with the C compiler.

Writes the extension modules and the digest of their sources to ``gpuquota/core/_compiled``; see
``gpuquota.native.loader`` for how and when they are used. ``--status`` prints which core runs here.
Needs mypy (the ``test`` extra) and a C compiler; skipped when the build is current. The exit wrapper
(``gpuquota.node_agent.native_wrapper``) is built even when the core's build fails, and the other way
round; the exit status is 1 when either failed (what failed keeps its Python version).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from gpuquota.native.loader import (
    COMPILED,
    CORE,
    DIGEST_FILE,
    GROUP,
    LIBRARY,
    PACKAGE,
    core_mode,
    core_modules,
    extension_suffix,
    sources_digest,
)


def build(quiet: bool = False) -> int:
    """Compile the core with mypyc into ``gpuquota/core/_compiled`` (skipped when it is current)."""
    digest = sources_digest()
    if DIGEST_FILE.exists() and DIGEST_FILE.read_text().strip() == digest:
        if not quiet:
            print("compiled core is current")
        return 0
    try:
        from mypyc.build import mypycify  # type: ignore[import-untyped]
        from setuptools import Distribution  # type: ignore[import-untyped]
    except ImportError as error:
        print(f"cannot build the compiled core: {error} (pip install -e '.[test]')", file=sys.stderr)
        return 1
    paths = [str(CORE / f"{name}.py") for name in core_modules()]
    print(f"compiling {len(paths)} core modules with mypyc (about 30 s) ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpuquota-native-") as work:
        cwd = os.getcwd()
        os.chdir(PACKAGE.parent)  # mypyc derives module names from paths relative to the source root
        try:
            extensions = mypycify(
                [os.path.relpath(p) for p in paths],
                separate=[([os.path.relpath(p) for p in paths], GROUP)],
                target_dir=os.path.join(work, "c"),
            )
            distribution = Distribution({"name": "gpuquota-core-native", "ext_modules": extensions})
            command = distribution.get_command_obj("build_ext")
            command.build_lib = os.path.join(work, "lib")
            command.build_temp = os.path.join(work, "tmp")
            command.parallel = os.cpu_count() or 1
            distribution.run_command("build_ext")
        finally:
            os.chdir(cwd)
        built = [
            *Path(work, "lib", "gpuquota", "core").glob(f"*{extension_suffix()}"),
            Path(work, "lib", f"{LIBRARY}{extension_suffix()}"),
        ]
        if COMPILED.exists():
            shutil.rmtree(COMPILED)
        COMPILED.mkdir()
        for library in built:
            shutil.copy2(library, COMPILED / library.name)
    DIGEST_FILE.write_text(digest + "\n")
    print(f"compiled core written to {COMPILED}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == []:
        from gpuquota.node_agent import native_wrapper

        core = build()
        return max(core, native_wrapper.build())
    if args == ["--status"]:
        from gpuquota.node_agent import native_wrapper

        print(core_mode())
        print(f"exit wrapper: {'compiled' if native_wrapper.native_command() else 'python'}")
        return 0
    print("usage: python -m gpuquota.entrypoints.build_native [--status]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
