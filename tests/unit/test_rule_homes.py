"""Each rule has one home: ranges and formats in the wire models, read from there by the gateway and
``gpuquota apply``; business rules in the core (``decide``), whose rejection the gateway answers."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

import gpuquota
from gpuquota.config.settings import SchedulerSettings
from gpuquota.core import DEFAULT_POLICY, ClusterState, SchedulingPolicy
from gpuquota.ctl.apply_doc import ShareDoc
from gpuquota.gateway.errors import ClientException
from gpuquota.gateway.params import Params
from gpuquota.wire.base import (
    BORROW_LIMIT_RULE,
    MAX_SHARE_LIMITS,
    UNITS_ONCE_RULE,
    UNLIMITED_BORROW,
    CapacityLimit,
    JobQueueSpec,
    JobSpec,
    QuotaShareSpec,
    ServiceEnvironmentSpec,
    Strategy,
)

LIMITS = (CapacityLimit(unit="ml.g5.xlarge", max_capacity=1),)


@pytest.mark.parametrize("strategy", [Strategy.RESERVE, Strategy.LEND])
def test_a_borrow_limit_needs_lend_and_borrow(strategy: Strategy) -> None:
    with pytest.raises(ValidationError) as refused:
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=LIMITS, strategy=strategy, borrow_limit=5)
    assert refused.value.errors()[0]["msg"] == BORROW_LIMIT_RULE
    spec = QuotaShareSpec(name="s", job_queue="q", capacity_limits=LIMITS, strategy=strategy)
    assert spec.borrow_limit == -1


def test_apply_builds_the_wire_spec() -> None:
    doc = ShareDoc(name="s", capacityLimits={"g": 2}, strategy="LEND", borrowLimit=3)
    with pytest.raises(ValidationError) as refused:
        doc.spec("q")
    assert refused.value.errors()[0]["msg"] == BORROW_LIMIT_RULE
    ok = ShareDoc(name="s", capacityLimits={"g": 2}, strategy="LEND_AND_BORROW", borrowLimit=3).spec("q")
    assert (ok.job_queue, ok.borrow_limit, ok.capacity_limits[0].max_capacity) == ("q", 3, 2)


@pytest.mark.parametrize(
    ("model", "field", "value", "message"),
    [
        (JobSpec, "priority", 10000, "schedulingPriority must be between 0 and 9999, got 10000"),
        (JobSpec, "priority", -1, "schedulingPriority must be between 0 and 9999, got -1"),
        (JobQueueSpec, "priority", 1001, "schedulingPriority must be between 0 and 1000, got 1001"),
    ],
)
def test_the_gateway_reads_ranges_from_the_wire_models(
    model: type[JobSpec | JobQueueSpec], field: str, value: int, message: str
) -> None:
    with pytest.raises(ClientException) as refused:
        Params({"schedulingPriority": value}).ranged("schedulingPriority", model, field)
    assert refused.value.message == message
    assert Params({"schedulingPriority": 7}).ranged("schedulingPriority", model, field) == 7


def test_a_spec_lists_each_unit_once() -> None:
    twice = (LIMITS[0], CapacityLimit(unit="ml.g5.xlarge", max_capacity=2))
    with pytest.raises(ValidationError) as refused:
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=twice, strategy=Strategy.LEND)
    assert refused.value.errors()[0]["msg"] == UNITS_ONCE_RULE
    with pytest.raises(ValidationError) as refused:
        ServiceEnvironmentSpec(name="e", capacity_limits=twice)
    assert refused.value.errors()[0]["msg"] == UNITS_ONCE_RULE


def test_a_share_limit_is_at_least_one() -> None:
    zero = (CapacityLimit(unit="ml.g5.xlarge", max_capacity=0),)
    with pytest.raises(ValidationError) as refused:
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=zero, strategy=Strategy.LEND)
    assert refused.value.errors()[0]["msg"] == "capacityLimits[0].maxCapacity must be at least 1, got 0"
    assert ServiceEnvironmentSpec(name="e", capacity_limits=zero).capacity_limits == zero


# ----- one home per literal: the source of gpuquota may not write these rules again ------------------

PACKAGE = Path(gpuquota.__file__).parent
TIMING_DEFAULTS = {"heartbeat_seconds", "heartbeat_timeout_ms", "preemption_grace", "tick_seconds"}
"""Parameters and fields whose default is a ``SchedulingPolicy`` figure (``core/policy.py``)."""


def _modules() -> Iterator[tuple[str, ast.Module, list[str]]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(source), source.splitlines()


def _is_number(node: ast.AST | None, *values: float) -> bool:
    value = getattr(node, "value", None)
    return (
        isinstance(node, ast.Constant) and isinstance(value, int | float) and not isinstance(value, bool)
    ) and (not values or value in values)


def _written_again(home: str, offends: Callable[[ast.AST, str], bool]) -> list[str]:
    """``module:line`` of every AST node outside ``home`` that ``offends`` (given the node's line);
    docstrings (string statements) are prose, not rules, and are skipped."""
    found = []
    for name, tree, lines in _modules():
        if name != home:
            found += [f"{name}:{line}" for line in _offending_lines(tree, lines, offends)]
    return found


def _offending_lines(tree: ast.AST, lines: list[str], offends: Callable[[ast.AST, str], bool]) -> list[int]:
    prose = {
        id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    return [
        n.lineno
        for n in ast.walk(tree)
        if hasattr(n, "lineno") and id(n) not in prose and offends(n, lines[n.lineno - 1])
    ]


def _borrow_floor(node: ast.AST, line: str) -> bool:
    """A ``-1`` on a line about a borrow limit (docstrings may say it: they are not ``-1`` nodes)."""
    minus_one = (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_number(node.operand, 1)
    )
    return minus_one and "borrow" in line.lower()


def _share_limit_count(node: ast.AST, line: str) -> bool:
    """A 5 on a line about capacity limits, or "... 5 capacity limits" in a message."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.search(r"\b5 capacity limits", node.value) is not None
    return _is_number(node, 5) and "capacit" in line.lower()


def _timing_default(node: ast.AST, line: str) -> bool:
    """A number as the default of a timing parameter or field, 30 s in ms, or 6 heartbeats in ms."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        pairs = [
            *zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True),
            *zip(args.kwonlyargs, args.kw_defaults, strict=True),
        ]
        return any(arg.arg in TIMING_DEFAULTS and _is_number(default) for arg, default in pairs)
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id in TIMING_DEFAULTS and _is_number(node.value)
    return _is_number(node, 30_000) or (_is_number(node, 6000) and "heartbeat" in line)


def test_the_borrow_limit_floor_is_written_once() -> None:
    assert _written_again("wire/base.py", _borrow_floor) == []
    assert QuotaShareSpec.model_fields["borrow_limit"].default == UNLIMITED_BORROW


def test_the_number_of_share_limits_is_written_once() -> None:
    assert _written_again("wire/base.py", _share_limit_count) == []
    many = tuple(CapacityLimit(unit=f"u{i}", max_capacity=1) for i in range(MAX_SHARE_LIMITS + 1))
    with pytest.raises(ValidationError):
        QuotaShareSpec(name="s", job_queue="q", capacity_limits=many, strategy=Strategy.LEND)
    with pytest.raises(ValidationError):
        ShareDoc(name="s", capacityLimits={c.unit: 1 for c in many}, strategy="LEND")


def test_the_timing_defaults_are_written_once_in_the_scheduling_policy() -> None:
    assert _written_again("core/policy.py", _timing_default) == []
    assert ClusterState().heartbeat_timeout_ms == DEFAULT_POLICY.heartbeat_timeout_ms == 30_000
    assert SchedulingPolicy(heartbeat_seconds=0.5).heartbeat_timeout_ms == 3000  # lost after 6 periods
    assert SchedulerSettings.model_fields["heartbeat_seconds"].default == DEFAULT_POLICY.heartbeat_seconds


@pytest.mark.parametrize(
    ("source", "check"),
    [
        ("limit = Field(ge=-1)  # borrowLimit", _borrow_floor),
        ('x = "between 1 and 5 capacity limits"', _share_limit_count),
        ("def f(*, heartbeat_seconds: float = 5.0) -> None: ...", _timing_default),
        ("class C:\n    tick_seconds: float = 1.0", _timing_default),
    ],
)
def test_the_home_checks_find_a_rule_written_again(
    source: str, check: Callable[[ast.AST, str], bool]
) -> None:
    assert _offending_lines(ast.parse(source), source.splitlines(), check) == [source.count("\n") + 1]
