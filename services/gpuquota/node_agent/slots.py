"""What a node offers: ``--slots`` specs, the instance type catalogue and NVML discovery (I3).

``parse_slots("ml.g5.xlarge=3,ml.g5.12xlarge=1")`` gives one :class:`SlotOffer` per instance; GPU
indices are assigned sequentially from 0 using the catalogue's GPU count per instance type (a type
missing from the catalogue carries no GPU). With ``with_gpus=False`` the slots carry no GPU indices
(a machine without GPUs, I3: "otherwise the configured slots carry no GPU indices").
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from gpuquota.wire.base import SlotOffer

log = logging.getLogger(__name__)

#: GPUs (or accelerators) per instance of common SageMaker training instance types.
INSTANCE_TYPE_GPUS: Mapping[str, int] = {
    "ml.g4dn.xlarge": 1,
    "ml.g4dn.2xlarge": 1,
    "ml.g4dn.12xlarge": 4,
    "ml.g4dn.metal": 8,
    "ml.g5.xlarge": 1,
    "ml.g5.2xlarge": 1,
    "ml.g5.4xlarge": 1,
    "ml.g5.8xlarge": 1,
    "ml.g5.16xlarge": 1,
    "ml.g5.12xlarge": 4,
    "ml.g5.24xlarge": 4,
    "ml.g5.48xlarge": 8,
    "ml.g6.xlarge": 1,
    "ml.g6.2xlarge": 1,
    "ml.g6.12xlarge": 4,
    "ml.g6.48xlarge": 8,
    "ml.g6e.xlarge": 1,
    "ml.g6e.12xlarge": 4,
    "ml.g6e.48xlarge": 8,
    "ml.p3.2xlarge": 1,
    "ml.p3.8xlarge": 4,
    "ml.p3.16xlarge": 8,
    "ml.p4d.24xlarge": 8,
    "ml.p4de.24xlarge": 8,
    "ml.p5.48xlarge": 8,
    "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    "ml.trn1.2xlarge": 1,
    "ml.trn1.32xlarge": 16,
    "ml.trn1n.32xlarge": 16,
}


class SlotSpecError(ValueError):
    pass


NODE_GROUP = re.compile(
    r"(?P<unit>[^=@]+?)\s*(?:=\s*(?P<slots>\d+)(?:\s*x\s*(?P<nodes>\d+))?)?"
    r"(?:\s*@\s*(?P<plan>[A-Za-z0-9_-]{1,128}))?"
)
"""One entry of ``gpuquota up --nodes``: ``INSTANCE_TYPE[=SLOTS[xNODES]][@PLAN]``; ``@PLAN``: the nodes
belong to training plan PLAN (S11, ``node-agent --training-plan``)."""


def parse_slot_counts(spec: str) -> list[tuple[str, int]]:
    """``"ml.g5.xlarge=3,ml.p4d.24xlarge=1"`` -> ``[("ml.g5.xlarge", 3), ("ml.p4d.24xlarge", 1)]``."""
    counts: list[tuple[str, int]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        unit, sep, raw = item.partition("=")
        unit, raw = unit.strip(), raw.strip()
        if not unit:
            raise SlotSpecError(f"expected INSTANCE_TYPE=COUNT, got {item!r}")
        if not sep:
            raw = "1"
        try:
            count = int(raw)
        except ValueError:
            raise SlotSpecError(f"expected INSTANCE_TYPE=COUNT, got {item!r}") from None
        if count < 0:
            raise SlotSpecError(f"negative count in {item!r}")
        if unit in (u for u, _ in counts):
            raise SlotSpecError(f"instance type {unit} given twice")
        counts.append((unit, count))
    return counts


def parse_slots(
    spec: str, catalogue: Mapping[str, int] = INSTANCE_TYPE_GPUS, *, with_gpus: bool = True
) -> tuple[SlotOffer, ...]:
    """The slots of a ``--slots`` spec, GPU indices assigned sequentially (see the module doc)."""
    slots: list[SlotOffer] = []
    next_gpu = 0
    for unit, count in parse_slot_counts(spec):
        per_slot = catalogue.get(unit, 0) if with_gpus else 0
        for _ in range(count):
            slots.append(SlotOffer(unit=unit, gpus=tuple(range(next_gpu, next_gpu + per_slot))))
            next_gpu += per_slot
    return tuple(slots)


def _nvml_gpu_count() -> int:
    """GPUs NVML sees; 0 when ``pynvml`` (nvidia-ml-py, optional) is missing or NVML fails."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return 0
    nvml: Any = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # no driver, no device, ...
        log.info("NVML not available: %s", exc)
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def discover_slots(
    instance_type_catalogue: Mapping[str, int] = INSTANCE_TYPE_GPUS,
    configured: str = "",
    *,
    gpu_count: Callable[[], int] = _nvml_gpu_count,
    default_unit: str = "ml.g5.xlarge",
) -> tuple[SlotOffer, ...]:
    """The node's slots.

    With GPUs visible through NVML: the ``configured`` spec (GPU indices assigned sequentially; the
    spec must not need more GPUs than present), or, without a spec, one ``default_unit`` slot per
    whole group of GPUs it needs. Without NVML or GPUs: the configured slots, carrying no GPU indices.
    """
    present = gpu_count()
    if present <= 0:
        return parse_slots(configured, instance_type_catalogue, with_gpus=False)
    if configured.strip():
        slots = parse_slots(configured, instance_type_catalogue)
        needed = sum(len(s.gpus) for s in slots)
        if needed > present:
            raise SlotSpecError(f"slots {configured!r} need {needed} GPUs, NVML found {present}")
        return slots
    per_slot = max(1, instance_type_catalogue.get(default_unit, 1))
    return parse_slots(f"{default_unit}={present // per_slot}", instance_type_catalogue)


def parse_node_groups(spec: str) -> list[tuple[str, int, int]]:
    """``gpuquota up --nodes``, one group of identical nodes per entry:
    ``"ml.g5.xlarge=1x2,ml.p4d.24xlarge=1"`` -> ``[("ml.g5.xlarge", 1, 2), ("ml.p4d.24xlarge", 1, 1)]``
    (instance type, slots per node, nodes)."""
    groups: list[tuple[str, int, int]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        match = NODE_GROUP.fullmatch(item)
        if match is None:
            raise SlotSpecError(
                "expected INSTANCE_TYPE=SLOTS or INSTANCE_TYPE=SLOTSxNODES (then @PLAN, optional), "
                f"got {item!r}"
            )
        groups.append((match["unit"], int(match["slots"] or 1), int(match["nodes"] or 1)))
    return groups


def parse_node_plans(spec: str) -> list[str | None]:
    """The training plan of each group of ``parse_node_groups(spec)`` (``@PLAN``; ``None``: none)."""
    plans: list[str | None] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        match = NODE_GROUP.fullmatch(item)
        plans.append(None if match is None else match["plan"])
    return plans


def node_slot_groups(
    spec: str, discover: Callable[[str], tuple[SlotOffer, ...]] = lambda s: discover_slots(configured=s)
) -> list[tuple[SlotOffer, ...]]:
    """The slots of each node of a ``--nodes`` spec, in its order (nodes without slots left out). The
    slots of the whole spec are discovered at once, then dealt out, so no two nodes share a GPU."""
    groups = parse_node_groups(spec)
    totals: dict[str, int] = {}
    for unit, slots, nodes in groups:
        totals[unit] = totals.get(unit, 0) + slots * nodes
    free: dict[str, list[SlotOffer]] = {}
    for offer in discover(",".join(f"{unit}={n}" for unit, n in totals.items())) if totals else ():
        free.setdefault(offer.unit, []).append(offer)
    return [slots for slots, _ in _deal(groups, parse_node_plans(spec), free)]


def node_plan_groups(spec: str) -> list[str | None]:
    """The training plan of each node of ``node_slot_groups(spec)``, in the same order."""
    groups = parse_node_groups(spec)
    free: dict[str, list[SlotOffer]] = {}
    for unit, slots, nodes in groups:  # stand-ins: only how many slots there are matters here
        free.setdefault(unit, []).extend([SlotOffer(unit=unit)] * (slots * nodes))
    return [plan for _, plan in _deal(groups, parse_node_plans(spec), free)]


def _deal(
    groups: list[tuple[str, int, int]], plans: list[str | None], free: dict[str, list[SlotOffer]]
) -> list[tuple[tuple[SlotOffer, ...], str | None]]:
    out: list[tuple[tuple[SlotOffer, ...], str | None]] = []
    for (unit, slots, nodes), plan in zip(groups, plans, strict=True):
        for _ in range(nodes):
            left = free.get(unit, [])
            if slots and left:
                out.append((tuple(left[:slots]), plan))
                del left[:slots]
    return out
