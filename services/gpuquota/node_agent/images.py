"""Training images of the ``container`` runtime: the operator's rewrite map, then the engine's pull.

Theory of operation
-------------------
A job names its image as it would on SageMaker (``AlgorithmSpecification.TrainingImage``), often an
ECR address such as the SageMaker SDK's PyTorch image, which a self-hosted node cannot or should not
reach. Before an attempt's containers start, the runtime:

1. **rewrites** the reference with the node's image map (``GPUQUOTA_IMAGE_MAP``, :class:`ImageMap`):
   a reference is looked up whole first (``repo:tag``, ``repo@digest``), then by its repository alone
   (an entry without tag maps every tag of that repository); an image the map does not name runs as
   given;
2. **pulls** the result when the engine does not have it (``image exists`` / ``image inspect``), with
   the engine's own registries, mirrors and credentials;
3. **fails** the attempt when the pull fails, with AWS's ``CannotPullContainerError: <the engine's
   message>`` as its statusReason (a launch failure: it counts against the job's retries like any
   other, and ``gpuquota explain`` shows it).

The map's text is ``from=to`` pairs separated by commas or white space, or a JSON object
``{"from": "to"}``; neither side may be empty. Parsing is pure (:meth:`ImageMap.parse`), so the
settings check it at start-up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

IMAGE_MAP_ENV = "GPUQUOTA_IMAGE_MAP"
PULL_TIMEOUT = 1800.0
"""Seconds a pull may take: large training images take minutes."""


class PullError(RuntimeError):
    """The engine could not pull the image; the message is the attempt's statusReason."""


def repository(reference: str) -> str:
    """``reference`` less its ``@digest`` or ``:tag`` (a ``:`` in the registry's ``host:port`` stays)."""
    name = reference.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


@dataclass(frozen=True)
class ImageMap:
    """The operator's image rewrites (``GPUQUOTA_IMAGE_MAP``): whole references, then repositories."""

    entries: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> ImageMap:
        """Raises ValueError naming what is wrong."""
        text = text.strip()
        if not text:
            return cls()
        if text.startswith("{"):
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"not a JSON object: {exc}") from None
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
                raise ValueError('expected {"from image": "to image", ...} with strings only')
            pairs = list(doc.items())
        else:
            items = [item for item in re.split(r"[\s,]+", text) if item]
            bad = [item for item in items if item.count("=") != 1]
            if bad:
                raise ValueError(f"expected from=to pairs, got {bad[0]!r}")
            pairs = [tuple(item.split("=", 1)) for item in items]  # type: ignore[misc]
        empty = [f"{k}={v}" for k, v in pairs if not k.strip() or not v.strip()]
        if empty:
            raise ValueError(f"an image may not be empty: {empty[0]!r}")
        return cls({k.strip(): v.strip() for k, v in pairs})

    def resolve(self, reference: str) -> str:
        """The image to run for ``reference``."""
        return self.entries.get(reference) or self.entries.get(repository(reference)) or reference


class Engine(Protocol):
    name: str

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
