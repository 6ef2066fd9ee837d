"""Training images of the ``container`` runtime: the operator's rewrite map, then the engine's pull.

Theory of operation
-------------------
A job names its image as it would on SageMaker (``AlgorithmSpecification.TrainingImage``), often an
ECR address such as the SageMaker SDK's PyTorch image, which a self-hosted node cannot or should not
reach. Before an attempt's containers start, the runtime:

1. **rewrites** the reference with the node's image map (``GPUQUOTA_IMAGE_MAP``,
   :class:`gpuquota.config.image_map.ImageMap`):
   a reference is looked up whole first (``repo:tag``, ``repo@digest``), then by its repository alone
   (an entry without tag maps every tag of that repository); an image the map does not name runs as
   given;
2. **pulls** the result when the engine does not have it (``image exists`` / ``image inspect``), with
   the engine's own registries, mirrors and credentials;
3. **fails** the attempt when the pull fails, with AWS's ``CannotPullContainerError: <the engine's
   message>`` as its statusReason (a launch failure: it counts against the job's retries like any
   other, and ``gpuquota explain`` shows it).

The map itself is pure, in ``gpuquota.config.image_map`` (the settings check it at start-up).
"""

from __future__ import annotations

from typing import Protocol

PULL_TIMEOUT = 1800.0
"""Seconds a pull may take: large training images take minutes."""


class PullError(RuntimeError):
    """The engine could not pull the image; the message is the attempt's statusReason."""


class Engine(Protocol):
    @property
    def name(self) -> str: ...

    async def call(self, *args: str, timeout: float | None = ...) -> tuple[int, str, str]: ...


async def ensure_image(engine: Engine, image: str) -> None:
    """Pulls ``image`` unless the engine has it; raises :class:`PullError` with AWS's reason."""
    exists = ("image", "exists", image) if engine.name == "podman" else ("image", "inspect", image)
    rc, _, _ = await engine.call(*exists)
    if rc == 0:
        return
    try:
        rc, _, err = await engine.call("pull", "--quiet", image, timeout=PULL_TIMEOUT)
    except TimeoutError:
        raise PullError(
            f"CannotPullContainerError: no answer from {engine.name} pull {image} within {PULL_TIMEOUT:g} s"
        ) from None
    if rc != 0:
        raise PullError(
            f"CannotPullContainerError: {pull_message(err) or f'{engine.name} pull {image} failed'}"
        )


def pull_message(stderr: str) -> str:
    """The engine's error line (``Error: ...`` of podman, ``Error response from daemon: ...`` of
    docker), without podman's retry warnings."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error")]
    line = (errors or lines or [""])[-1]
    return line.removeprefix("Error: ")
