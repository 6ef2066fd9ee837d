"""The local training image of the SageMaker SDK's jobs (``gpuquota demo --sdk``, the blog's test).

The blog's ``ModelTrainer`` names the SDK's PyTorch image in AWS's ECR, which a self-hosted node does
not pull: the node's image map (``GPUQUOTA_IMAGE_MAP``, ``gpuquota.config.image_map``) sends that
repository to this image instead. It is ``localhost/gpuquota-python:dev`` (Debian's python3 and pip,
built from Debian's packages by ``deploy/local/images.sh python``: what the SDK's ``sm_train.sh``
needs) with one layer more: a ``python3`` first on ``PATH`` that waits ``start_seconds`` once per
container before it runs Debian's. A SageMaker instance takes minutes to start; without that wait the
blog's ``echo 'Hello World'`` ends within a second, before the blog's next step could preempt it.
The layer is tagged by a hash of its content and of the base's image id, so it is built once.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

from gpuquota.ctl.api import CliError

#: ``services/gpuquota/ctl`` -> the checkout's root
IMAGES_SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "local" / "images.sh"
PYTHON_IMAGE = "localhost/gpuquota-python:dev"
ECR_PYTORCH = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training"
"""The repository of the SDK's ``image_uris.retrieve(framework="pytorch", region="us-east-1", ...)``."""
START_SECONDS = 15
SLOW_PYTHON = """#!/bin/sh
# gpuquota's SDK image: the container starts slowly, as a SageMaker instance does (once per container)
if [ ! -e /tmp/.gpuquota-started ]; then sleep {seconds}; : > /tmp/.gpuquota-started; fi
exec /usr/bin/python3 "$@"
"""
CONTAINERFILE = f"""FROM {PYTHON_IMAGE}
COPY python3 /usr/local/bin/python3
RUN chmod 755 /usr/local/bin/python3
"""


def image_map(image: str, repository: str = ECR_PYTORCH) -> str:
    """``GPUQUOTA_IMAGE_MAP``'s text that runs ``image`` for every tag of ``repository``."""
    return f"{repository}={image}"


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(f"{argv[0]}: {exc}") from None


def build_sdk_image(engine: str, start_seconds: int = START_SECONDS) -> str:
    """Builds (once) the image and returns its name; :class:`CliError` saying what is missing."""
    if not IMAGES_SCRIPT.is_file():
        raise CliError(
            f"the SDK's image is built by deploy/local/images.sh of a gpuquota checkout ({IMAGES_SCRIPT})"
        )
    built = _run(["bash", str(IMAGES_SCRIPT), "python"], 1800)
    if built.returncode != 0:
        tail = "\n".join(built.stderr.strip().splitlines()[-5:])
        raise CliError(
            f"deploy/local/images.sh python failed (it needs mmdebstrap and Debian's mirror):\n{tail}"
        )
    base = _run([engine, "image", "inspect", "--format", "{{.Id}}", PYTHON_IMAGE], 60).stdout.strip()
    script = SLOW_PYTHON.format(seconds=int(start_seconds))
    digest = hashlib.sha256((base + script + CONTAINERFILE).encode()).hexdigest()[:12]
    image = f"localhost/gpuquota-sdk-trainer:{digest}"
    if _run([engine, "image", "inspect", image], 60).returncode == 0:
        return image
    with tempfile.TemporaryDirectory(prefix="gpuquota-sdk-image-") as tmp:
        (Path(tmp) / "python3").write_text(script)
        (Path(tmp) / "Containerfile").write_text(CONTAINERFILE)
        done = _run([engine, "build", "--quiet", "--tag", image, "--file", f"{tmp}/Containerfile", tmp], 600)
    if done.returncode != 0:
        raise CliError(f"cannot build the SDK's image: {done.stderr.strip()}")
    return image
