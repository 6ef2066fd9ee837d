"""Typed access to a request body: every wrong type or missing field becomes a ``ClientException``."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from gpuquota.gateway.errors import ClientException

T = TypeVar("T")

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
MAX_TAGS = 50
MAX_INTEGER = 2**31 - 1
"""AWS's ``Integer`` shape is a signed 32-bit integer: larger values are refused, never stored."""


def child(path: str, key: str) -> str:
    """The path of member ``key`` of the value at ``path`` (``""``: the body itself)."""
    return f"{path}.{key}" if path else key


def missing(path: str) -> ClientException:
    return ClientException(f"Missing required parameter: {path}")


def wrong_type(path: str, expected: str) -> ClientException:
    return ClientException(f"Invalid type for parameter {path}: expected {expected}")


def not_one_of(path: str, allowed: Sequence[str], value: str) -> ClientException:
    return ClientException(f"{path} must be one of {', '.join(allowed)}, got {value}")


def length_error(path: str, low: int | None, high: int | None, unit: str) -> ClientException:
    """A string's length (``unit`` ``characters``) or a list's (``entries``) outside ``low``..``high``."""
    verb = "must be" if unit == "characters" else "can have"
    if low is not None and high is not None:
        return ClientException(f"{path} {verb} {low} to {high} {unit}")
    if high is not None:
        return ClientException(f"{path} {verb} at most {high} {unit}")
    return ClientException(f"{path} {verb} at least {low} {unit}")


def out_of_range(path: str, low: float | None, high: float | None, value: float) -> ClientException:
    if low is not None and high is not None:
        return ClientException(f"{path} must be between {low} and {high}, got {value}")
    if low is not None:
        return ClientException(f"{path} must be at least {low}, got {value}")
    return ClientException(f"{path} must be at most {high}, got {value}")


class Params:
    """A JSON object from a request, with checked getters. ``where`` names it in messages.

    The bodies of AWS Batch operations have been checked against botocore's model before an
    operation reads them (``gateway.shapes``): there the getters' type and presence checks hold
    already, and the rules they add are gpuquota's own (names, the wire models' ranges). The same
    getters check what no model describes here, the SageMaker ``serviceRequestPayload``."""

    def __init__(self, body: dict[str, Any], where: str = "") -> None:
        self.body = body
        self.where = where

    def _path(self, key: str) -> str:
        return child(self.where, key)

    def has(self, key: str) -> bool:
        return self.body.get(key) is not None

    def _get(self, key: str, required: bool) -> Any:
        value = self.body.get(key)
        if value is None and required:
            raise missing(self._path(key))
        return value

    def _typed(self, key: str, required: bool, kind: type, expected: str) -> Any:
        """The value of ``key`` if it is a ``kind`` (``None`` if absent and not ``required``)."""
        value = self._get(key, required)
        if value is not None and not isinstance(value, kind):
            raise wrong_type(self._path(key), expected)
        return value

    def string(self, key: str, required: bool = False, max_len: int | None = None) -> str | None:
        value: str | None = self._typed(key, required, str, "a string")
        if value is not None and max_len is not None and len(value) > max_len:
            raise length_error(self._path(key), None, max_len, "characters")
        return value

    def req_string(self, key: str, max_len: int | None = None) -> str:
        value = self.string(key, required=True, max_len=max_len)
        assert value is not None
        return value

    def name(self, key: str, required: bool = True) -> str | None:
        value = self.string(key, required=required)
        if value is not None and not NAME_RE.match(value):
            raise ClientException(
                f"{self._path(key)} must be 1 to 128 characters: "
                "letters, numbers, hyphens (-) and underscores (_)"
            )
        return value

    def req_name(self, key: str) -> str:
        value = self.name(key, required=True)
        assert value is not None
        return value

    def integer(
        self, key: str, required: bool = False, low: int | None = None, high: int | None = None
    ) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong_type(self._path(key), "an integer")
        if high is None and value > MAX_INTEGER:
            raise out_of_range(self._path(key), None, MAX_INTEGER, value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise out_of_range(self._path(key), low, high, value)
        return int(value)

    def ranged(self, key: str, model: type[BaseModel], field: str, required: bool = False) -> int | None:
        """An integer within the range the wire model ``model`` gives its ``field`` (its one home)."""
        low = high = None
        for bound in model.model_fields[field].metadata:
            low, high = getattr(bound, "ge", low), getattr(bound, "le", high)
        return self.integer(key, required, low=low, high=high)

    def req_integer(self, key: str, low: int | None = None, high: int | None = None) -> int:
        value = self.integer(key, required=True, low=low, high=high)
        assert value is not None
        return value

    def enum(self, key: str, allowed: Sequence[str], required: bool = False) -> str | None:
        value = self.string(key, required=required)
        if value is not None and value not in allowed:
            raise not_one_of(self._path(key), allowed, value)
        return value

    def req_unit(self, key: str = "capacityUnit") -> str:
        """An instance type (capacity unit): 1 to 128 characters."""
        unit = self.req_string(key, max_len=128)
        if not unit:
            raise ClientException(f"{self._path(key)} must not be empty")
        return unit

    def req_enum(self, key: str, allowed: Sequence[str]) -> str:
        value = self.enum(key, allowed, required=True)
        assert value is not None
        return value

    def obj(self, key: str, required: bool = False) -> Params | None:
        value = self._typed(key, required, dict, "an object")
        return None if value is None else Params(value, self._path(key))

    def array(self, key: str, required: bool = False, max_items: int | None = None) -> list[Any] | None:
        value: list[Any] | None = self._typed(key, required, list, "a list")
        if value is not None and max_items is not None and len(value) > max_items:
            raise length_error(self._path(key), None, max_items, "entries")
        return value

    def objs(self, key: str, required: bool = False, max_items: int | None = None) -> list[Params] | None:
        items = self.array(key, required, max_items)
        if items is None:
            return None
        out = []
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise wrong_type(f"{self._path(key)}[{index}]", "an object")
            out.append(Params(item, f"{self._path(key)}[{index}]"))
        return out

    def strs(self, key: str, required: bool = False, max_items: int | None = None) -> list[str] | None:
        items = self.array(key, required, max_items)
        if items is None:
            return None
        if not all(isinstance(item, str) for item in items):
            raise wrong_type(self._path(key), "a list of strings")
        return items

    def tags(self, key: str = "tags") -> dict[str, str] | None:
        value = self._typed(key, False, dict, "a map")
        return None if value is None else check_tags(value)


def check_tags(tags: dict[str, str]) -> dict[str, str]:
    """AWS's rules on a resource's tags that its model does not hold (the keys and values were checked
    against the model, ``gateway.shapes``): at most 50, none under the prefix ``aws:``."""
    if len(tags) > MAX_TAGS:
        raise ClientException(f"A resource can have at most {MAX_TAGS} tags")
    for k in tags:
        if k.lower().startswith("aws:"):
            raise ClientException(f"Invalid value for tags: the prefix aws: is reserved for AWS use ({k})")
    return dict(tags)


def paginate(items: Sequence[T], params: Params) -> tuple[list[T], str | None]:
    """One page of ``items`` for ``maxResults`` (1..100, default 100) and ``nextToken``."""
    limit = params.integer("maxResults", low=1, high=100) or 100
    token = params.string("nextToken")
    start = 0
    if token:
        start = _token_offset(token)
    page = list(items[start : start + limit])
    end = start + len(page)
    next_token = None
    if end < len(items):
        next_token = base64.urlsafe_b64encode(json.dumps({"offset": end}).encode()).decode()
    return page, next_token


def with_token(out: dict[str, Any], token: str | None) -> dict[str, Any]:
    """``out`` with ``nextToken`` when there is a next page."""
    if token:
        out["nextToken"] = token
    return out


def _token_offset(token: str) -> int:
    """The offset a ``nextToken`` of ours holds; anything else (forged, corrupt, out of range:
    ``{"offset": 1e999}``, deep nesting) is the caller's error, never ours."""
    try:
        offset: object = json.loads(base64.urlsafe_b64decode(token.encode()))["offset"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, binascii.Error):
        raise ClientException("Invalid value for nextToken") from None
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= 2**31:
        raise ClientException("Invalid value for nextToken")
    return offset
