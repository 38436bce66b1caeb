"""Build dataclasses from untrusted JSON, checking every field against its type hint.

Supported hints: int, float, str, bool, dict, list[X], X | None, and nested dataclasses.
Range checks belong in each dataclass's ``__post_init__`` (raise ValueError).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, TypeVar

from engine.wire import ProtocolError

T = TypeVar("T")
MAX_STR = 64 * 1024
MAX_LIST = 100_000


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Return ``cls(**data)`` after validating types, or raise ProtocolError."""
    label = where or cls.__name__
    if not isinstance(data, dict):
        raise ProtocolError(f"{label}: expected a JSON object")
    kwargs = {}
    for name, hint, required in _fields(cls):
        if name not in data:
            if required:
                raise ProtocolError(f"{label}: missing field '{name}'")
            continue
        kwargs[name] = _coerce(hint, data[name], f"{label}.{name}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"{label}: {exc}") from None


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of each field: resolving the annotations once per class, not
    once per message, halved the backbone's cost of a progress report."""
    hints = typing.get_type_hints(cls)
    missing = dataclasses.MISSING
    return tuple((f.name, hints[f.name], f.default is missing and f.default_factory is missing)
                 for f in dataclasses.fields(cls) if f.init)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(inner[0], value, where)
        raise ProtocolError(f"{where}: unsupported union")
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list")
        if len(value) > MAX_LIST:
            raise ProtocolError(f"{where}: list too long")
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer")
        if abs(value) > 2**63:
            raise ProtocolError(f"{where}: integer out of range")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where}: expected a number")
        if not math.isfinite(value):
            raise ProtocolError(f"{where}: expected a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string")
        if len(value) > MAX_STR:
            raise ProtocolError(f"{where}: string too long")
        return value
    if hint is Any:
        return value
    raise ProtocolError(f"{where}: unsupported field type {hint!r}")


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)
