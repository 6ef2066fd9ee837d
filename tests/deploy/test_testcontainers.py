"""testcontainers, run for real through podman's Docker API and the local images (``make images``):

- integration tests that need Kafka and PostgreSQL (tests/pipeline/test_services.py) with both from
  testcontainers instead of the launchers (``GPUQUOTA_TEST_SERVICES=containers``);
- the platform team's test of docs/testing-your-platform.md, copied from the page as it is, with
  ``GpuquotaContainer``;
- the plugin's docker mode (tests/plugin/test_example.py with ``--gpuquota-mode docker``).

Each runs in a pytest of its own, so that the services come from where it says and nothing of this
session's (its Kafka, its database) leaks in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testcontainers_services import docker_host

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_DOC = ROOT / "docs" / "testing-your-platform.md"


def pytest_run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    docker_host()  # DOCKER_HOST and testcontainers' settings, exported to the child
    child = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL")}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=cwd, env={**child, **env}, capture_output=True, text=True, timeout=600)


def passed(done: subprocess.CompletedProcess[str], count: int) -> None:
    assert done.returncode == 0 and f"{count} passed" in done.stdout, (
        done.stdout[-3000:] + done.stderr[-2000:]
    )


def test_integration_tests_with_kafka_and_postgres_from_testcontainers() -> None:
    done = pytest_run(["tests/pipeline/test_services.py"], ROOT, GPUQUOTA_TEST_SERVICES="containers")
    passed(done, 2)


def platform_example() -> str:
    """The page's Python block that uses ``GpuquotaContainer``."""
    blocks = re.findall(r"```python\n(.*?)```", PLATFORM_DOC.read_text(), re.DOTALL)
    (example,) = [block for block in blocks if "GpuquotaContainer(" in block]
    return str(example)


def test_the_platform_teams_gpuquota_container_example_runs(tmp_path: Path) -> None:
    (tmp_path / "test_platform.py").write_text(platform_example())
    passed(pytest_run(["test_platform.py"], tmp_path), 1)


def test_the_plugins_docker_mode_runs_the_example() -> None:
    done = pytest_run(["tests/plugin/test_example.py", "--gpuquota-mode", "docker"], ROOT)
    passed(done, 1)


@pytest.fixture(autouse=True, scope="module")
def _images() -> None:
    """The images, built when missing (cached: seconds otherwise; ``make test`` builds them first)."""
    subprocess.run(["bash", str(ROOT / "deploy" / "local" / "images.sh"), "all"], check=True, timeout=1200)
