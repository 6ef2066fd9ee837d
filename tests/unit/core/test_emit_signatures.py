"""``Context.emit``'s typed overloads name their event's fields (the ids and time aside).

The overloads are what mypy checks each ``emit`` against, and ``emit`` builds events without
validation (``gpuquota.wire.fast_construct``): an overload that drifted from its wire model would let
an event miss a field unnoticed. An overload requires every field the model requires and may leave
out fields with a default.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gpuquota.core
from gpuquota.wire import events as ev

_ADDED_BY_EMIT = {"event_id", "occurred_at", "type", "schema_version"}


def _overloads() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((Path(gpuquota.core.__file__).parent / "context.py").read_text())  # compiled or not
    found: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "emit" and node.decorator_list:
            annotation = node.args.args[1].annotation
            assert isinstance(annotation, ast.Subscript) and isinstance(annotation.slice, ast.Attribute)
            found[annotation.slice.attr] = node
    return found


def test_each_overload_requires_its_events_required_fields_and_names_no_other() -> None:
    overloads = _overloads()
    assert len(overloads) >= 20
    for name, node in overloads.items():
        model = getattr(ev, name)
        fields = {n: f for n, f in model.model_fields.items() if n not in _ADDED_BY_EMIT}
        arguments = {
            a.arg: d is not None for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
        }
        required = {n for n, f in fields.items() if f.is_required()}
        assert set(arguments) <= set(fields), f"{name}: not fields of the model"
        assert {n for n, optional in arguments.items() if not optional} == required, name
