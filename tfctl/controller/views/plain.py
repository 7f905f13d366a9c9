"""Frozen dataclasses to plain JSON values and back, by their type hints: what a view gathers on
the controller's side crosses its socket as data and is rendered by the terminal that asked."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from tfctl.supervisor.records import Wire


def to_plain(value: Any) -> Any:
    if isinstance(value, Wire):
        return value.to_wire()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def from_plain(kind: Any, data: Any) -> Any:
    """`data` as `kind` (a class or a type hint such as `dict[str, Finding]` or `int | None`)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        return from_plain(next(a for a in args if a is not type(None)), data)
    if origin is tuple:
        items = args[:1] * len(data) if len(args) == 2 and args[1] is Ellipsis else args
        return tuple(from_plain(a, v) for a, v in zip(items, data))
    if origin is list:
        return [from_plain(args[0], v) for v in data]
    if origin is dict:
        return {k: from_plain(args[1], v) for k, v in data.items()}
    if isinstance(kind, type) and issubclass(kind, Wire):
        return kind.from_wire(data)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        fields = {f.name for f in dataclasses.fields(kind)}
        return kind(**{name: from_plain(hints[name], v) for name, v in data.items() if name in fields})
    if kind is float and isinstance(data, int):
        return float(data)
    return data
