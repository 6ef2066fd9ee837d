"""An optimisation: ``model_construct`` for trusted values, without pydantic's per-field work.

The core builds every event from validated inputs and its own state, the pipeline every input result
from decided events, the simulator every job of a validated trace: none needs validating, and
pydantic's own ``model_construct`` walks each field's aliases and defaults on every call, which cost
more than the core's decision on many inputs. ``fast_construct`` sets what ``model_construct`` sets,
from a template made once per model. The tests round-trip every event type and every input result
through JSON (``tests/unit/test_fast_construct.py`` compares it with ``model_construct``).

Measured against pydantic's ``model_construct`` in alternating runs (compiled core, 2026-12-03):
``benchmarks.core --queued 10000 --inputs 50000`` CPU 1.91 -> 1.52 s (median of 4 pairs, calibration
58-119 ms); ``benchmarks.pipeline_cpu --jobs 12000`` 0.195 -> 0.171 ms per job for the core's events
and 0.184 -> 0.171 for the input results (median of 6, calibration 58-207 ms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_Template = tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...], set[str]]
_TEMPLATES: dict[type[Any], _Template | None] = {}
_set = object.__setattr__


def _template(model: type[BaseModel]) -> _Template | None:
    """Every field of the model in declaration order with its plain default (``None`` where it has
    none), its default factories, and the set of its field names; ``None`` when the model needs
    pydantic's own ``model_construct`` (aliases or a post-init hook)."""
    fields = model.model_fields
    if model.__pydantic_post_init__ or any(f.alias or f.validation_alias for f in fields.values()):
        return None
    defaults = {name: None if f.is_required() else f.default for name, f in fields.items()}
    factories = tuple(
        (name, cast(Callable[[], Any], f.default_factory))
        for name, f in fields.items()
        if f.default_factory is not None
    )
    return defaults, factories, set(fields)


# measured: 1.91 -> 1.52 s on benchmarks.core, 0.195 -> 0.171 ms/job on benchmarks.pipeline_cpu (2026-12-03)
def fast_construct(model: type[M], fields: dict[str, Any]) -> M:
    """``model.model_construct(**fields)`` for trusted ``fields``, which must name every required field.

    Plain defaults are shared, not copied: they are immutable (strings, numbers, enums, None). So is
    the set of set fields (all of them): pydantic copies it before changing a copy of a model.
    """
    try:
        template = _TEMPLATES[model]
    except KeyError:
        template = _TEMPLATES[model] = _template(model)
    if template is None:
        return model.model_construct(**fields)
    defaults, factories, names = template
    values = defaults.copy()
    for name, factory in factories:
        if name not in fields:
            values[name] = factory()
    values.update(fields)
    built = model.__new__(model)
    _set(built, "__dict__", values)
    _set(built, "__pydantic_fields_set__", names)
    _set(built, "__pydantic_extra__", None)
    _set(built, "__pydantic_private__", None)
    return built
