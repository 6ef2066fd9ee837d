"""A training image built locally for the container runtime's tests (no registry is reachable).

``FROM scratch`` with Debian's static busybox and a shell "trainer" that follows SageMaker's
contract: it records what it saw (hyperparameters, resource config, channel, ``SM_*`` variables) in
``/opt/ml/model``, resumes from ``$SM_CHECKPOINT_DIR/step``, checkpoints on SIGTERM, fails with
``/opt/ml/output/failure`` when asked, and writes ``/opt/ml/model/done`` at the end.

Hyperparameters: ``steps`` (default 3), ``sleep`` (seconds a step, default 0.1), ``fail`` (a failure
message: write it and exit 3), ``fail_host`` (only that instance fails), ``resolve`` (a host name to
look up; the instances wait for each other's look-up, multi-instance jobs).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from gpuquota.node_agent.container import LABEL, ContainerEngine, EngineMissing

BUSYBOX = Path("/bin/busybox")
TRAINER = r"""#!/bin/busybox sh
M=/opt/ml/model
C=${SM_CHECKPOINT_DIR:-/opt/ml/checkpoints}
step=0
[ -f "$C/step" ] && step=$(cat "$C/step")
echo "$step" > "$M/resumed_from"
echo "$SM_CURRENT_HOST" >> "$C/starts"
echo "$@" > "$M/argv"
cp /opt/ml/input/config/hyperparameters.json "$M/hyperparameters.json"
cp /opt/ml/input/config/resourceconfig.json "$M/resourceconfig.json"
cp /opt/ml/input/config/inputdataconfig.json "$M/inputdataconfig.json"
env | grep -E '^(SM_|MASTER_|WORLD_SIZE|NODE_RANK|GPUQUOTA_|NVIDIA_|CUDA_)' | sort > "$M/env"
for ch in $(ls /opt/ml/input/data 2>/dev/null); do cat /opt/ml/input/data/$ch/* > "$M/channel-$ch"; done
touch "$C/probe" 2>/dev/null && echo writable > "$M/checkpoint-writable"
if [ -n "${SM_HP_RESOLVE:-}" ]; then
  # look the peer up (retrying while it starts), then wait until every instance has: none ends early
  i=0
  until nslookup "$SM_HP_RESOLVE" > "$M/resolved" 2>&1 || [ $i -ge 100 ]; do sleep 0.2; i=$((i + 1)); done
  grep -q Address "$M/resolved" || rm -f "$M/resolved"
  touch "$C/resolved-$SM_CURRENT_HOST"
  hosts=$(echo "$SM_HOSTS" | tr ',' '\n' | grep -c algo)
  i=0
  until [ "$(ls "$C" | grep -c '^resolved-')" -ge "$hosts" ] || [ $i -ge 300 ]; do
    sleep 0.2
    i=$((i + 1))
  done
fi
on_term() {
  echo "$step" > "$C/step"
  echo "sigterm at step $step" >> "$C/events"
  exit 143
}
trap on_term TERM
fail_here=${SM_HP_FAIL_HOST:-$SM_CURRENT_HOST}
if [ -n "${SM_HP_FAIL:-}" ] && [ "$fail_here" = "$SM_CURRENT_HOST" ]; then
  echo "$SM_HP_FAIL" > /opt/ml/output/failure
  exit 3
fi
steps=${SM_HP_STEPS:-3}
while [ "$step" -lt "$steps" ]; do
  sleep "${SM_HP_SLEEP:-0.1}" &
  wait $!
  step=$((step + 1))
  echo "$step" > "$C/step"
  echo "step $step"
done
echo "$step" > "$M/done"
"""
CONTAINERFILE = """FROM scratch
COPY busybox /bin/busybox
COPY trainer.sh /trainer.sh
ENTRYPOINT ["/bin/busybox", "sh", "/trainer.sh"]
"""


def find_engine() -> ContainerEngine:
    """The node's engine; the test FAILS without one (``make install`` installs podman)."""
    try:
        return ContainerEngine.find()
    except EngineMissing as exc:
        pytest.fail(f"{exc}: run deploy/local/podman.sh install")


def build_trainer_image(engine: ContainerEngine) -> str:
    """Builds the image once per content (tagged by its hash); returns its name."""
    digest = hashlib.sha256((TRAINER + CONTAINERFILE).encode()).hexdigest()[:12]
    image = f"localhost/gpuquota-test-trainer:{digest}"
    if subprocess.run([engine.path, "image", "exists", image], capture_output=True).returncode == 0:
        return image
    if not BUSYBOX.exists():
        pytest.fail(f"{BUSYBOX} is missing: run deploy/local/podman.sh install (busybox-static)")
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        shutil.copy(BUSYBOX, context / "busybox")
        (context / "trainer.sh").write_text(TRAINER)
        (context / "Containerfile").write_text(CONTAINERFILE)
        built = subprocess.run(
            [engine.path, "build", "--quiet", "--tag", image, "--file", str(context / "Containerfile"), tmp],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert built.returncode == 0, f"image build failed: {built.stderr}"
    return image


def remove_job_containers(engine: ContainerEngine, job_id: str) -> list[str]:
    """Removes the containers (and networks) of ``job_id``; returns the containers still there."""
    listed = subprocess.run(
        engine.argv("ps", "--all", "--format", "{{.Names}}", "--filter", f"label={LABEL}.job_id={job_id}"),
        capture_output=True,
        text=True,
    )
    names = [n for n in listed.stdout.split() if n]
    if names:
        subprocess.run(engine.argv("rm", "--force", "--time", "0", *names), capture_output=True)
    networks = subprocess.run(
        engine.argv("network", "ls", "--format", "{{.Name}}"), capture_output=True, text=True
    )
    for network in networks.stdout.split():
        if job_id in network:  # a multi-instance attempt's network, left by a test that failed
            subprocess.run(engine.argv("network", "rm", "--force", network), capture_output=True)
    return names


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
