"""The training image of ``gpuquota demo --runtime container``, built locally (no registry needed).

``FROM scratch`` with Debian's static busybox (package ``busybox-static``) and a shell trainer that
follows SageMaker's contract: it counts steps into ``$SM_CHECKPOINT_DIR/step`` (resuming from it),
stops on SIGTERM or after the ``seconds`` hyperparameter, and writes ``/opt/ml/model/steps``. The
image is tagged by a hash of its content, so it is built once per machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpuquota.ctl.api import CliError

BUSYBOX = Path("/bin/busybox")
RUNTIME_LINES = {  # the demo's line about how its jobs run
    "process": "process runtime: each job is a local Python process; preemption stops it with SIGTERM",
    "container": "container runtime: each job is a container of a local image; preemption stops it",
    "simulated": "simulated runtime: no processes",
}
TRAINER = r"""#!/bin/busybox sh
C=${SM_CHECKPOINT_DIR:-/opt/ml/checkpoints}
step=0
[ -f "$C/step" ] && step=$(cat "$C/step")
echo "$GPUQUOTA_JOB_NAME attempt $GPUQUOTA_ATTEMPT on $SM_CURRENT_HOST: starting at step $step"
stopping=""
trap 'stopping=1' TERM
end=$(( $(date +%s) + ${SM_HP_SECONDS:-600} ))
while [ -z "$stopping" ] && [ "$(date +%s)" -lt "$end" ]; do
  sleep 0.1 &
  wait $!
  step=$((step + 1))
  echo "$step" > "$C/step"
done
echo "$step" > /opt/ml/model/steps
echo "$GPUQUOTA_JOB_NAME: ${stopping:+SIGTERM}${stopping:-done} at step $step"
"""
CONTAINERFILE = """FROM scratch
COPY busybox /bin/busybox
COPY trainer.sh /trainer.sh
ENTRYPOINT ["/bin/busybox", "sh", "/trainer.sh"]
"""


def build_demo_image(engine: str | None = None) -> str:
    """Builds (once) and returns the demo image's name; :class:`CliError` when it cannot."""
    from gpuquota.node_agent.container import ContainerEngine, EngineMissing

    try:
        found = ContainerEngine.find(engine)
    except EngineMissing as exc:
        raise CliError(str(exc)) from None
    image = (
        "localhost/gpuquota-demo-trainer:"
        + hashlib.sha256((TRAINER + CONTAINERFILE).encode()).hexdigest()[:12]
    )
    if subprocess.run([found.path, "image", "inspect", image], capture_output=True).returncode == 0:
        return image
    if not BUSYBOX.exists():
        raise CliError(
            f"{BUSYBOX} is missing: apt-get install busybox-static (deploy/local/podman.sh install)"
        )
    with tempfile.TemporaryDirectory(prefix="gpuquota-demo-image-") as tmp:
        shutil.copy(BUSYBOX, Path(tmp) / "busybox")
        (Path(tmp) / "trainer.sh").write_text(TRAINER)
        (Path(tmp) / "Containerfile").write_text(CONTAINERFILE)
        built = subprocess.run(
            [found.path, "build", "--quiet", "--tag", image, "--file", str(Path(tmp) / "Containerfile"), tmp],
            capture_output=True,
            text=True,
        )
    if built.returncode != 0:
        raise CliError(f"cannot build the demo image: {built.stderr.strip()}")
    return image


def container_payload(image: str, unit: str, seconds: int) -> str:
    """A SageMaker CreateTrainingJob request running the demo image (no entrypoint: "<image> train")."""
    return json.dumps(
        {
            "TrainingJobName": "gpuquota-demo",
            "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
            "HyperParameters": {"seconds": str(seconds)},
            "ResourceConfig": {"InstanceType": unit, "InstanceCount": 1, "VolumeSizeInGB": 1},
            "StoppingCondition": {"MaxRuntimeInSeconds": seconds + 60},
        }
    )
