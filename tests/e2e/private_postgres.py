"""A PostgreSQL cluster of one test's own, from ``deploy/local/postgres.sh``, that it may crash.

The suite's PostgreSQL trades durability for speed (no fsync, no synchronous commit): a crash of it
loses the last commits, as a failover to an asynchronous replica would. A test that SIGKILLs the
database to check what production sees starts its own with production durability (``PG_DURABLE=1``)
in its own run directory, so the rest of the suite never sees the crash.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local" / "postgres.sh"


class PrivatePostgres:
    def __init__(self, run_dir: Path, *, durable: bool = True) -> None:
        self.run_dir = run_dir
        self.env = {**os.environ, "PG_RUN_DIR": str(run_dir), "PG_DURABLE": "1" if durable else "0"}
        self.env.pop("DATABASE_URL", None)  # else the script starts nothing and records that URL
        self.url = ""

    def _run(self, action: str) -> str:
        done = subprocess.run(
            ["bash", str(SCRIPT), action], env=self.env, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"postgres.sh {action} failed:\n{done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    def start(self) -> None:
        self._run("start")
        self.url = (self.run_dir / "url").read_text().strip()

    def crash(self) -> None:
        """SIGKILL the postmaster and every server process."""
        self._run("crash")

    def restart(self) -> float:
        """Start the crashed cluster again (crash recovery); the seconds until it accepts logins."""
        began = time.monotonic()
        said = self._run("restart")
        assert re.search(r"restarted in", said), said
        return time.monotonic() - began

    async def settings(self) -> dict[str, str]:
        """The durability settings the server runs with (``SHOW``)."""
        connection = await asyncpg.connect(self.url)
        try:
            names = ("fsync", "synchronous_commit", "full_page_writes")
            return {name: str(await connection.fetchval(f"SHOW {name}")) for name in names}
        finally:
            await connection.close()

    def stop(self) -> None:
        self._run("stop")
