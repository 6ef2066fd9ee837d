"""Session fixtures for the external services the integration tests need.

``kafka_bootstrap`` and ``database_url`` find a service in this order:

1. the environment: ``KAFKA_BOOTSTRAP_SERVERS`` / ``DATABASE_URL`` (what ``make test`` exports);
2. testcontainers (``tests/testcontainers_services.py``: the local images ``make images`` builds), when
   ``GPUQUOTA_TEST_SERVICES=containers`` (then through podman's API socket if no Docker daemon runs;
   tests/deploy/test_testcontainers.py runs integration tests so) or when a Docker daemon answers
   ``docker.from_env().ping()``;
3. the local launchers ``deploy/local/kafka.sh`` / ``deploy/local/postgres.sh`` (Kafka from Maven
   jars, PostgreSQL from Debian's package), started for this session and stopped at its end.

If none works, the test is skipped, except when ``CI`` is set: then it fails.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ROOT / "deploy" / "local"


def use_containers() -> bool:
    """Kafka and PostgreSQL from testcontainers rather than the launchers (see the module docstring)."""
    return os.environ.get("GPUQUOTA_TEST_SERVICES") == "containers" or docker_available()


@functools.cache
def docker_available() -> bool:
    """True if a Docker *daemon* answers (the CLI alone is not enough)."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False
    # docker-py leaks the socket of a failed connect; drop that ResourceWarning here instead of
    # letting it surface (as an error, filterwarnings=error) in whichever test runs the next GC.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False
        finally:
            gc.collect()


def unavailable(what: str, var: str, reason: str) -> NoReturn:
    msg = f"no {what}: {reason}. Set {var}, run a Docker daemon, or fix deploy/local (see docs/testing.md)"
    if os.environ.get("CI"):
        pytest.fail(msg, pytrace=False)  # integration tests never silently skip in CI
    pytest.skip(msg)


class LauncherError(RuntimeError):
    pass


class LocalService:
    """Runs ``deploy/local/<script> start|stop`` with a private run directory."""

    def __init__(self, script: str, run_dir_var: str, result_file: str) -> None:
        self.script = str(LAUNCHERS / script)
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"gpuquota-{Path(script).stem}-run."))
        self.result_file = self.run_dir / result_file
        self.env = {**os.environ, run_dir_var: str(self.run_dir), "KAFKA_PYTHON": sys.executable}
        self.env.pop("DATABASE_URL", None)

    def start(self) -> str:
        proc = subprocess.run(
            ["bash", self.script, "start"], env=self.env, capture_output=True, text=True, timeout=600
        )
        # the "ready ... in N.Ns" line; visible with -s or in the captured setup output on failure
        sys.stderr.write(proc.stderr + proc.stdout)
        if proc.returncode != 0 or not self.result_file.is_file():
            tail = "\n".join((proc.stderr + proc.stdout).splitlines()[-30:])
            raise LauncherError(f"{self.script} start exited {proc.returncode}:\n{tail}")
        return self.result_file.read_text().strip()

    def stop(self) -> None:
        try:
            subprocess.run(["bash", self.script, "stop"], env=self.env, timeout=120, check=False)
        finally:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def _sigterm_as_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"terminated by signal {signum}")


def _local(script: str, run_dir_var: str, result_file: str, what: str, var: str) -> Iterator[str]:
    # A SIGTERM (e.g. from `timeout`) would end pytest without running fixture finalizers and
    # leave the service running; as KeyboardInterrupt, pytest tears the session down first.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_keyboard_interrupt)
    service = LocalService(script, run_dir_var, result_file)
    try:
        value = service.start()
    except (LauncherError, OSError, subprocess.TimeoutExpired) as exc:
        service.stop()
        unavailable(what, var, f"local launcher failed: {exc}")
    except BaseException:  # interrupted while starting: stop whatever got started
        service.stop()
        raise
    try:
        yield value
    finally:
        service.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Kafka bootstrap servers, ``host:port[,host:port]``."""
    if servers := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield servers
    elif use_containers():
        from tests.testcontainers_services import kafka_container

        with kafka_container() as servers:
            yield servers
    else:
        yield from _local("kafka.sh", "KAFKA_RUN_DIR", "bootstrap", "Kafka", "KAFKA_BOOTSTRAP_SERVERS")


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A ``postgresql://user:password@host:port/db`` URL usable by asyncpg."""
    if url := os.environ.get("DATABASE_URL"):
        yield url
    elif use_containers():
        from tests.testcontainers_services import postgres_container

        with postgres_container() as url:
            yield url
    else:
        yield from _local("postgres.sh", "PG_RUN_DIR", "url", "PostgreSQL", "DATABASE_URL")


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs an entry point in-process (``gpuquota up``, the scheduler service) installs a
    handler on the stderr pytest captured for it; left in place, a later test's log line would be
    written to that closed stream ("I/O operation on closed file")."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """A real S3-compatible server (S3Proxy, ``deploy/local/s3.sh``) for this session: the
    ``GPUQUOTA_S3_*`` variables of its client (``client.env``, the secret itself included)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_keyboard_interrupt)
    service = LocalService("s3.sh", "S3_RUN_DIR", "endpoint")
    try:
        service.start()
    except (LauncherError, OSError, subprocess.TimeoutExpired) as exc:
        service.stop()
        unavailable("S3 server", "S3_RUN_DIR", f"local launcher failed: {exc}")
    try:
        pairs = (line.split("=", 1) for line in (service.run_dir / "client.env").read_text().splitlines())
        env = dict(pairs)
        env["GPUQUOTA_S3_SECRET_ACCESS_KEY"] = (service.run_dir / "secret").read_text().strip()
        del env["GPUQUOTA_S3_SECRET_ACCESS_KEY_FILE"]
        yield env
    finally:
        service.stop()
