"""``gpuquota up --s3 local|URL``: the S3 its node agents use.

``local`` runs the checkout's ``deploy/local/s3.sh`` (S3Proxy, a real S3-compatible server) with its
run directory under the stack's data directory (``<data dir>/s3``: the buckets survive a restart),
reads the endpoint and key pair it writes (``client.env``), and stops it when the stack exits. ``URL``
is an endpoint that runs already; its key pair comes from ``GPUQUOTA_S3_ACCESS_KEY_ID`` and
``GPUQUOTA_S3_SECRET_ACCESS_KEY`` (or ``..._FILE``). Without ``--s3``, ``GPUQUOTA_S3_ENDPOINT_URL``
decides (unset: no S3).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuquota.config.s3 import S3Settings

#: ``services/gpuquota/entrypoints`` -> the checkout's root
_ROOT = Path(__file__).resolve().parents[3]
S3_SCRIPT = _ROOT / "deploy" / "local" / "s3.sh"
START_TIMEOUT = 300.0
"""Seconds ``s3.sh start`` may take (the first one resolves S3Proxy's jars with Maven)."""


class LocalS3Error(RuntimeError):
    """``--s3 local`` could not start the server; the message says why."""


@dataclass
class LocalS3:
    """The S3Proxy that ``--s3 local`` started; :meth:`stop` it when the stack exits."""

    run_dir: Path

    def start(self) -> dict[str, str]:
        """Starts it (or finds it running); the ``GPUQUOTA_S3_*`` variables of its client."""
        if not S3_SCRIPT.is_file():
            raise LocalS3Error(f"--s3 local needs deploy/local/s3.sh of a gpuquota checkout ({S3_SCRIPT})")
        try:
            proc = subprocess.run(
                ["bash", str(S3_SCRIPT), "start"],
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LocalS3Error(f"deploy/local/s3.sh start: {exc}") from None
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
            raise LocalS3Error(f"deploy/local/s3.sh start exited {proc.returncode}:\n{tail}")
        print(proc.stdout.strip(), flush=True)  # "s3 ready on http://127.0.0.1:PORT ..."
        return _read_env(self.run_dir / "client.env")

    def stop(self) -> None:
        subprocess.run(
            ["bash", str(S3_SCRIPT), "stop"], env=self._env(), capture_output=True, timeout=60, check=False
        )

    def _env(self) -> dict[str, str]:
        return {**os.environ, "S3_RUN_DIR": str(self.run_dir)}


def _read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


@dataclass(frozen=True)
class S3Client:
    """The S3 that ``gpuquota env`` tells clients of: its endpoint and, for the server ``--s3 local``
    runs, its key pair (the gateway hands it out only without authentication)."""

    endpoint: str
    key: tuple[str, str] | None = field(default=None, repr=False)


def s3_client(settings: S3Settings, local: LocalS3 | None) -> S3Client | None:
    """``None`` without S3; the key of an operator's ``--s3 URL`` is the node agents' own, never told."""
    if not settings.s3_endpoint_url:
        return None
    secret = settings.s3_secret() if local is not None else None
    key = (settings.s3_access_key_id, secret) if secret is not None else None
    return S3Client(settings.s3_endpoint_url, key)


def s3_settings(
    arg: str | None, environ: Mapping[str, str], data_dir: Path
) -> tuple[S3Settings, LocalS3 | None]:
    """The node agents' S3 settings for ``--s3 arg``, and the server to stop on exit (``local``).
    Raises ``SettingsError`` or :class:`LocalS3Error`."""
    env = dict(environ)
    local = None
    if arg == "local":
        local = LocalS3(data_dir.absolute() / "s3")
        env = {k: v for k, v in env.items() if not k.startswith("GPUQUOTA_S3_SECRET_ACCESS_KEY")}
        try:
            env |= local.start()
        except BaseException:
            local.stop()
            raise
    elif arg:
        env["GPUQUOTA_S3_ENDPOINT_URL"] = arg
    try:
        return S3Settings.s3_from_env(env), local
    except BaseException:
        if local is not None:
            local.stop()
        raise
