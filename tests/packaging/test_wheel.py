"""The wheel and sdist that ``python -m build`` makes, installed into a clean virtual environment (issue #28).

A platform team adopts gpuquota by ``pip install``: the built wheel must carry everything the code reads at
run time (the console's static files, the SQL migrations, the exit wrapper's C source), declare its license
as an SPDX expression and its extras, and run ``gpuquota demo`` to ``PASS 3/3`` with nothing from this
checkout on the path. The install uses the pins of constraints.txt, as ``make install`` does.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_FILES = (
    "gpuquota/gateway/console/static/index.html",
    "gpuquota/gateway/console/static/console.js",
    "gpuquota/adapters/migrations/0001_event_log.sql",
    "gpuquota/node_agent/exit_wrapper.c",
    "gpuquota/py.typed",
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out)
    return out


def run(command: list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    tail = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, f"{command[:3]} exited {done.returncode}:\n{tail}"
    return done.stdout + done.stderr


def only(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"{pattern}: {found}"
    return found[0]


def test_the_wheel_carries_the_runtime_files_and_its_metadata(dist: Path) -> None:
    with zipfile.ZipFile(only(dist, "gpuquota-*.whl")) as wheel:
        names = set(wheel.namelist())
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    assert [f for f in RUNTIME_FILES if f not in names] == []
    assert not [n for n in names if n.startswith("tests/")], "the tests stay out of the wheel"
    assert metadata["License-Expression"] == "Apache-2.0"
    assert {"plots", "sdk"} <= set(metadata.get_all("Provides-Extra") or [])
    requires = " ".join(metadata.get_all("Requires-Dist") or [])
    assert "matplotlib" in requires and 'extra == "plots"' in requires, "plotting is an extra"


def test_the_sdist_builds_the_same_package(dist: Path) -> None:
    with tarfile.open(only(dist, "gpuquota-*.tar.gz")) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert "pyproject.toml" in names
    assert [f for f in RUNTIME_FILES if f"services/{f}" not in names] == []


def test_a_clean_venv_with_the_wheel_runs_the_demo(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    wheel = only(dist, "gpuquota-*.whl")
    bin_dir = venv / "bin"
    pins = str(ROOT / "constraints.txt")
    run([str(bin_dir / "pip"), "install", "-q", "-c", pins, str(wheel)], cwd=tmp_path)
    output = run([str(bin_dir / "gpuquota"), "demo"], cwd=tmp_path, timeout=120)
    assert "PASS  3/3 steps passed" in output, output[-2000:]
    imported = run([str(bin_dir / "python"), "-c", "import gpuquota; print(gpuquota.__file__)"], cwd=tmp_path)
    assert str(venv) in imported, f"gpuquota came from {imported.strip()}, not the venv"
