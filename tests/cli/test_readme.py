"""The README's "Command line" block runs as written (issue #28): in a fresh directory holding a
``train.py`` (and the repository's ``deploy/``), as one bash script with ``set -e``, against the real
``gpuquota up`` it starts. Only two things are added: ``GPUQUOTA_PORT``/``GPUQUOTA_ENDPOINT`` (a
free port, not 8642), and after a line that ends in ``&``, a wait (with a deadline) until the
backgrounded ``gpuquota up`` answers, which a person typing the lines does by reading "gpuquota ready".
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.pipeline.services import free_port

ROOT = Path(__file__).resolve().parents[2]
TRAIN = "import time\nfor step in range(3):\n    print('step', step, flush=True)\n    time.sleep(0.2)\n"
WAIT_READY = "for _ in $(seq 300); do gpuquota nodes >/dev/null 2>&1 && break; sleep 0.2; done"


def command_block() -> list[str]:
    """The lines of the bash block under "## Command line"."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"## Command line\n\n```bash\n(.*?)```", text, re.S)
    assert found, "README.md has no Command line block"
    return [line for line in found.group(1).splitlines() if line.strip()]


def script(lines: list[str]) -> str:
    out = ["set -ex"]
    for line in lines:
        out.append(line)
        if line.split("#", 1)[0].rstrip().endswith("&"):
            out.append(WAIT_READY)
    return "\n".join(out) + "\n"


def test_every_line_of_the_readme_command_block_works(tmp_path: Path) -> None:
    lines = command_block()
    assert any("jobs submit" in line for line in lines) and lines[0].startswith("gpuquota up &")
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQUOTA_KAFKA", "GPUQUOTA_DATABASE_URL")}
    env |= {"GPUQUOTA_PORT": str(port), "GPUQUOTA_ENDPOINT": f"http://127.0.0.1:{port}", "NO_COLOR": "1"}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["bash", "-c", script(lines)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert "step 0\nstep 1\nstep 2\n" in done.stdout  # jobs logs --follow: train.py ran, in this directory
    assert "3/3 steps passed" in done.stdout  # gpuquota demo
    assert f"runs in {tmp_path}" in done.stderr
