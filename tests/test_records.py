"""The supervisor's record classes behave as frozen dataclasses do, without their start-up cost."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Callable, ClassVar, List, Mapping, Optional, Tuple

import pytest

from tfctl.supervisor.records import Record, Wire, field, record


@record
class Point(Record):
    KIND: ClassVar[str] = "point"

    x: int
    y: int = 0
    tags: List[str] = field(default_factory=list)


def test_construction_defaults_and_fresh_factories() -> None:
    a, b = Point(1), Point(x=2, y=3, tags=["t"])
    assert (a.x, a.y, a.tags) == (1, 0, []) and (b.x, b.y, b.tags) == (2, 3, ["t"])
    assert Point(1).tags is not Point(1).tags
    assert Point.FIELDS == ("x", "y", "tags") and Point.KIND == "point"


def test_equality_hash_repr_and_replace() -> None:
    assert Point(1, 2) == Point(x=1, y=2) and Point(1, 2) != Point(1, 3)
    assert hash(Point(1, 2, ())) == hash(Point(1, 2, ()))  # type: ignore[arg-type]
    assert repr(Point(1)) == "Point(x=1, y=0, tags=[])"
    moved = Point(1, 2).replace(y=5)
    assert moved == Point(1, 5) and Point(1, 2).y == 2


@pytest.mark.parametrize(
    "make",
    [lambda: Point(), lambda: Point(1, 2, [], 4), lambda: Point(1, z=3), lambda: Point(1, x=1)],  # type: ignore[call-arg, misc]
)
def test_wrong_arguments_are_type_errors(make: Callable[[], Point]) -> None:
    with pytest.raises(TypeError):
        make()


def test_records_are_frozen() -> None:
    p = Point(1)
    with pytest.raises(AttributeError, match="frozen"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del p.x


@record
class Leaf(Wire):
    name: str


@record
class Tree(Wire):
    NESTED: ClassVar[Mapping[str, object]] = {"leaves": ("tuple", Leaf), "first": ("one", Leaf)}
    TUPLES: ClassVar[Tuple[str, ...]] = ("sizes",)

    leaves: Tuple[Leaf, ...]
    sizes: Optional[Tuple[int, ...]] = None
    first: Optional[Leaf] = None
    plain: List[int] = field(default_factory=list)


def test_tuples_come_back_as_tuples_from_json() -> None:
    tree = Tree((Leaf("a"), Leaf("b")), (1, 2), Leaf("a"), [3])
    wire = json.loads(json.dumps(tree.to_wire()))
    assert wire == {"leaves": [{"name": "a"}, {"name": "b"}], "sizes": [1, 2], "first": {"name": "a"}, "plain": [3]}
    back = Tree.from_wire(wire)
    assert back == tree
    assert type(back.leaves) is tuple and type(back.sizes) is tuple and type(back.plain) is list
    assert Tree.from_wire({"leaves": []}) == Tree(())  # absent and None stay as they are


def test_the_protocol_imports_without_dataclasses_or_inspect() -> None:
    code = (
        "import sys, tfctl.supervisor.protocol\n"
        "print(sorted(m for m in ('dataclasses', 'inspect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
