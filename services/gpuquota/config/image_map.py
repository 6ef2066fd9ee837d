"""The operator's rewrite map of training images (``GPUQUOTA_IMAGE_MAP``): pure, so that the settings
check it at start-up and the ``container`` runtime applies it (``gpuquota.node_agent.images``).

The map's text is ``from=to`` pairs separated by commas or white space, or a JSON object
``{"from": "to"}``; neither side may be empty. A reference is looked up whole first (``repo:tag``,
``repo@digest``), then by its repository alone, so an entry without a tag maps every tag of that
repository; an image the map does not name is left as given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

IMAGE_MAP_ENV = "GPUQUOTA_IMAGE_MAP"


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
            pairs = [(k, v) for k, _, v in (item.partition("=") for item in items)]
        empty = [f"{k}={v}" for k, v in pairs if not k.strip() or not v.strip()]
        if empty:
            raise ValueError(f"an image may not be empty: {empty[0]!r}")
        return cls({k.strip(): v.strip() for k, v in pairs})

    def resolve(self, reference: str) -> str:
        """The image to run for ``reference``."""
        return self.entries.get(reference) or self.entries.get(repository(reference)) or reference
