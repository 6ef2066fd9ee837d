"""Request shapes from botocore's ``batch`` service model: what every body must be before its operation.

Theory of operation
-------------------
boto3 builds every request from botocore's ``batch`` service model, the description of the API that
AWS publishes; the gateway checks what arrives against the same model, so the shape of a request has
one home and follows AWS's when botocore's model changes. ``RequestShapes.check(operation, body)``
walks the JSON body along the operation's input shape, member by member in the model's order: every
required member present (``null`` is absent), every member of its type (a string; an integer, never a
boolean, within the 32 bits of ``Integer`` or the 64 of ``Long``; a number; a boolean; a list; an
object for a structure or a map), strings and lists within the lengths the model gives (``min``,
``max``), numbers within its range, strings of an ``enum`` shape one of its values, and the keys and
values of maps, items of lists and members of structures likewise. The first violation is HTTP 400
``ClientException`` naming the member by its path (``retryStrategy.evaluateOnExit[0].action``), in
the texts of ``gateway.params``. Members bound to the URI or the query string (``resourceArn``,
``tagKeys``) are not in the body and are checked by their routes; members the model does not know
are ignored, as AWS ignores them.

What the model does not say stays with the operations, by hand: gpuquota's names (``NAME_RE``); the
ranges of the wire models (``Params.ranged``: priorities, ``maxCapacity``, ``borrowLimit``...); the
enums gpuquota narrows (``jobQueueType`` SAGEMAKER_TRAINING, a time-limit ``action`` TERMINATE); the
bounds AWS documents and its model lacks (at most 100 ARNs or names, 50 jobs to terminate, 5 exit
rules, 1 to 5 capacity limits, a ``reason`` of 1,024 characters); the size of a map (a resource's tags
are counted after a TagResource merges them, ``params.check_tags``); and the SageMaker
``serviceRequestPayload``, a string here. An ``evaluateOnExit`` ``action`` is case-insensitive, as
AWS documents, so its enum is compared upper-cased (``CASE_INSENSITIVE``).

botocore's own ``ParamValidator`` is the client's check: it leaves enums and maxima to the server and
reports every error at once in texts of its own, so the walk is written here over the model's public
``Shape`` API (``botocore.model``). Each input shape is compiled once into a tree of closures, one a
shape: a SubmitServiceJob body as boto3 sends it takes 4.2 us, a DescribeServiceJob one 0.9 us (2-core
development box at load 8), about 1 % of the gateway's 0.33-0.40 ms of server CPU per submission in
``benchmarks.gateway``, whose before/after runs differed by less than their noise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import botocore.session

from gpuquota.gateway.params import (
    MAX_INTEGER,
    child,
    length_error,
    missing,
    not_one_of,
    out_of_range,
    wrong_type,
)

Check = Callable[[Any, str], None]
"""Raises a ``ClientException`` unless the value (at the path given) fits its shape."""

CASE_INSENSITIVE = frozenset({"ServiceJobRetryAction"})
"""Enum shapes whose values AWS compares case-insensitively."""
_INTEGERS = {"integer": (-MAX_INTEGER - 1, MAX_INTEGER), "long": (-(2**63), 2**63 - 1)}
"""The range of each integer type: AWS's ``Integer`` is 32 bits, ``Long`` 64."""


class RequestShapes:
    """The compiled input shapes of a service's operations, by operation name."""

    def __init__(self, model: Any, operations: Iterable[str]) -> None:
        self._compiled: dict[str, Check] = {}
        self.checks = {name: self._body(model.operation_model(name).input_shape) for name in operations}

    def check(self, operation: str, body: Mapping[str, Any]) -> None:
        self.checks[operation](body, "")

    def _body(self, shape: Any) -> Check:
        """The top level: the members that travel in the body (not the URI's or the query's)."""
        members = {
            name: member
            for name, member in shape.members.items()
            if member.serialization.get("location") is None
        }
        return self._structure(members, shape.required_members)

    def _compile(self, shape: Any) -> Check:
        """The check of a named shape, built once (a shape that refers to itself checks lazily)."""
        name = shape.name
        if name not in self._compiled:
            self._compiled[name] = lambda value, path: self._compiled[name](value, path)
            self._compiled[name] = self._build(shape)
        return self._compiled[name]

    def _build(self, shape: Any) -> Check:
        kind = shape.type_name
        if kind == "structure":
            return self._structure(shape.members, shape.required_members)
        if kind == "list":
            return self._list(shape)
        if kind == "map":
            return self._map(shape)
        if kind == "string":
            return _string(shape)
        if kind in _INTEGERS:
            return _number(shape, (int,), "an integer", *_INTEGERS[kind])
        if kind in ("float", "double"):
            return _number(shape, (int, float), "a number", None, None)
        if kind == "boolean":
            return _boolean
        return _anything  # timestamps and blobs: no operation gpuquota serves takes one

    def _structure(self, members: Mapping[str, Any], required: Iterable[str]) -> Check:
        """Required members first (in the model's order), then each member sent (unknown: ignored)."""
        checks = {name: self._compile(shape) for name, shape in members.items()}
        needed = tuple(name for name in members if name in frozenset(required))

        def check(body: Any, path: str) -> None:
            if not isinstance(body, dict):
                raise wrong_type(path, "an object")
            for name in needed:
                if body.get(name) is None:
                    raise missing(child(path, name))
            for name, value in body.items():
                member = checks.get(name)
                if member is not None and value is not None:
                    member(value, child(path, name))

        return check

    def _list(self, shape: Any) -> Check:
        item = self._compile(shape.member)
        low, high = shape.metadata.get("min"), shape.metadata.get("max")

        def check(items: Any, path: str) -> None:
            if not isinstance(items, list):
                raise wrong_type(path, "a list")
            if (low is not None and len(items) < low) or (high is not None and len(items) > high):
                raise length_error(path, low, high, "entries")
            for index, value in enumerate(items):
                item(value, f"{path}[{index}]")

        return check

    def _map(self, shape: Any) -> Check:
        key, value = self._compile(shape.key), self._compile(shape.value)

        def check(pairs: Any, path: str) -> None:
            if not isinstance(pairs, dict):
                raise wrong_type(path, "a map")
            for name, item in pairs.items():
                key(name, f"{path} key {name!r}")
                value(item, child(path, name))

        return check


def _string(shape: Any) -> Check:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    allowed = tuple(shape.enum)
    folded = shape.name in CASE_INSENSITIVE

    def check(value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise wrong_type(path, "a string")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            raise length_error(path, low, high, "characters")
        if allowed and (value.upper() if folded else value) not in allowed:
            raise not_one_of(path, allowed, value)

    return check


def _number(
    shape: Any, types: tuple[type, ...], expected: str, floor: int | None, ceiling: int | None
) -> Check:
    """A number (never a boolean) within the model's range, then its type's (``floor``, ``ceiling``)."""
    low, high = shape.metadata.get("min"), shape.metadata.get("max")

    def check(value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, types):
            raise wrong_type(path, expected)
        if (low is not None and value < low) or (high is not None and value > high):
            raise out_of_range(path, low, high, value)
        if ceiling is not None and value > ceiling:
            raise out_of_range(path, None, ceiling, value)
        if floor is not None and value < floor:
            raise out_of_range(path, floor, None, value)

    return check


def _boolean(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        raise wrong_type(path, "a boolean")


def _anything(value: Any, path: str) -> None:
    return None


@functools.cache
def batch_shapes(operations: tuple[str, ...]) -> RequestShapes:
    """The compiled shapes of ``operations`` of botocore's ``batch`` model (loaded once)."""
    model = botocore.session.get_session().get_service_model("batch")
    return RequestShapes(model, operations)
