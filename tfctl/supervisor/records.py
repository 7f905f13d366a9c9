"""Frozen record classes that cost nothing to define: the supervisor's dataclasses, and `Wire`,
the records that travel as JSON between the controller and a host.

Every supervisor start (one per host per command, one per task monitor) imports the protocol's
thirty-odd message classes. `dataclasses` builds each class by compiling generated methods, which
cost ~25 ms per start (plus ~10 ms to import `dataclasses` and `inspect`) on every host. Here the
methods live once in `Record`; `@record` only notes the fields in order with their defaults.
Type checkers see `@record` as a frozen dataclass (PEP 681 `dataclass_transform`).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Mapping, Tuple, Type, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_options: Any) -> Callable[[Any], Any]:
        return lambda decorated: decorated


T = TypeVar("T")
R = TypeVar("R", bound="Record")


class _Factory:
    """A default made anew for each record, like dataclasses' `default_factory`."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """`x: List[int] = field(default_factory=list)`, as with dataclasses."""
    return _Factory(default_factory)  # type: ignore[return-value]


class Record:
    """Base of every record: keyword or positional construction, equality, hash, repr, frozen."""

    FIELDS: ClassVar[Tuple[str, ...]] = ()
    DEFAULTS: ClassVar[Dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = type(self).FIELDS
        if len(args) > len(names):
            raise TypeError("%s takes %d arguments, got %d" % (type(self).__name__, len(names), len(args)))
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError("%s got an unexpected or repeated argument %r" % (type(self).__name__, name))
            values[name] = value
        for name in names:
            if name not in values:
                if name not in type(self).DEFAULTS:
                    raise TypeError("%s is missing the argument %r" % (type(self).__name__, name))
                default = type(self).DEFAULTS[name]
                values[name] = default.make() if isinstance(default, _Factory) else default
            object.__setattr__(self, name, values[name])

    def _values(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, name) for name in type(self).FIELDS)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        fields = ", ".join("%s=%r" % (name, getattr(self, name)) for name in type(self).FIELDS)
        return "%s(%s)" % (type(self).__name__, fields)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("%s is frozen: cannot set %r" % (type(self).__name__, name))

    def __delattr__(self, name: str) -> None:
        raise AttributeError("%s is frozen: cannot delete %r" % (type(self).__name__, name))

    def replace(self: R, **changes: Any) -> R:
        """A copy with some fields changed (dataclasses.replace)."""
        return type(self)(**{**{name: getattr(self, name) for name in type(self).FIELDS}, **changes})


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: Type[R]) -> Type[R]:
    """Make `cls` (a Record subclass) a record of its annotated fields, in order; ClassVars are not
    fields, and a class attribute of the same name is the field's default."""
    names = []
    defaults: Dict[str, Any] = {}
    for base in reversed(cls.__mro__[1:]):  # fields of record bases come first
        names += [n for n in getattr(base, "FIELDS", ()) if n not in names]
        defaults.update(getattr(base, "DEFAULTS", {}))
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if "ClassVar" in str(annotation) or name in ("FIELDS", "DEFAULTS"):
            continue
        if name not in names:
            names.append(name)
        if name in cls.__dict__:
            defaults[name] = cls.__dict__[name]
            if isinstance(defaults[name], _Factory):
                delattr(cls, name)
    cls.FIELDS = tuple(names)
    cls.DEFAULTS = defaults
    return cls


W = TypeVar("W", bound="Wire")


class Wire(Record):
    """A record that converts to and from plain JSON values.

    `NESTED` names the fields that hold other Wire classes, as ("one" | "list" | "tuple" | "dict",
    class); `ENUMS` names the fields that hold enums; `TUPLES` the fields of plain values kept as
    tuples (JSON gives lists back). Unknown keys from a newer peer are ignored.
    """

    NESTED: ClassVar[Mapping[str, Any]] = {}
    ENUMS: ClassVar[Mapping[str, Any]] = {}
    TUPLES: ClassVar[Tuple[str, ...]] = ()

    def to_wire(self) -> Dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in type(self).FIELDS}

    @classmethod
    def from_wire(cls: Type[W], data: Mapping[str, Any]) -> W:
        if not isinstance(data, Mapping):
            raise ValueError("%s: expected an object, got %r" % (cls.__name__, data))
        names = set(cls.FIELDS)
        values = {k: v for k, v in data.items() if k in names}
        for name, (shape, kind) in cls.NESTED.items():
            value = values.get(name)
            if value is None:
                continue
            if shape == "one":
                values[name] = kind.from_wire(value)
            elif shape == "list":
                values[name] = [kind.from_wire(v) for v in value]
            elif shape == "tuple":
                values[name] = tuple(kind.from_wire(v) for v in value)
            else:
                values[name] = {k: kind.from_wire(v) for k, v in value.items()}
        for name, kind in cls.ENUMS.items():
            if values.get(name) is not None:
                values[name] = kind(values[name])
        for name in cls.TUPLES:
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        try:
            return cls(**values)
        except TypeError as e:
            raise ValueError("%s: %s" % (cls.__name__, e)) from None


def _plain(value: Any) -> Any:
    if isinstance(value, Wire):
        return value.to_wire()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
