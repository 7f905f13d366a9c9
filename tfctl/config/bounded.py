"""What a cluster file may cost the parser: its size, its nesting, and its nodes once YAML
aliases are expanded (an alias bomb of anchors nested ten deep would otherwise build billions).

The file's author is trusted to mean what they write, not to be careful: these bounds turn a
wrong `-f /dev/zero`, a 60 MB log passed by mistake or a pasted alias bomb into a clear error
within a fraction of a second, and keep PyYAML's recursive composer far from Python's recursion
limit. Each is far above what a real cluster file needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml

MAX_FILE = 1 << 20  # bytes
MAX_DEPTH = 64  # collections inside one another
MAX_NODES = 10_000  # every value, key and item, counted as often as aliases repeat it


class TooBig(yaml.composer.ComposerError):
    """A bound passed while composing; `problem` names it, `fix` says what to do."""

    def __init__(self, problem: str, fix: str, mark: yaml.Mark | None) -> None:
        super().__init__(None, None, problem, mark)
        self.fix = fix


def read_head(path: Path) -> bytes:
    """The file's first MAX_FILE + 1 bytes: enough to know it is too big, whatever it is."""
    with path.open("rb") as file:
        return file.read(MAX_FILE + 1)


def too_big_text() -> str:
    return f"is larger than {MAX_FILE >> 20} MiB, the most a cluster file may be"


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader's composer, counting as it composes: every node once, and for each alias the
    nodes of what it names, known from when that was composed; so nothing is ever expanded to
    count it, and a file of a million small values stops at the first value over the bound."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0  # of the document so far, aliases expanded
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, depth), aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            node = cast(yaml.Node, super().compose_node(parent, index))  # None only at a stream's end
            # an alias of a collection still being composed (one that holds it): loader.py refuses it
            self._count(self._measured.get(id(node), (1, 0))[0], node)
            return node
        if self._depth >= MAX_DEPTH:
            raise _too_deep(self.peek_event().start_mark)
        self._depth += 1
        try:
            node = cast(yaml.Node, super().compose_node(parent, index))  # None only at a stream's end
        finally:
            self._depth -= 1
        self._measure(node)
        self._count(1, node)
        return node

    def _count(self, nodes: int, node: yaml.Node) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise TooBig(
                f"more than {MAX_NODES} values once YAML aliases (`*name`) are expanded, the most a cluster "
                "file may have",
                "write the values out, or use fewer aliases of big anchors; a cluster file needs far fewer",
                node.start_mark,
            )

    def _measure(self, node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            self._measured[id(node)] = (1, 0)
            return
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        sizes = [self._measured.get(id(child), (1, 0)) for child in children]
        depth = 1 + max((d for _, d in sizes), default=0)
        if depth > MAX_DEPTH:
            raise _too_deep(node.start_mark)
        self._measured[id(node)] = (1 + sum(n for n, _ in sizes), depth)


def _too_deep(mark: yaml.Mark) -> TooBig:
    return TooBig(
        f"lists and mappings nested more than {MAX_DEPTH} deep (aliases expanded), the most a cluster file may have",
        "flatten the nesting; tfctl's settings are at most a few levels deep",
        mark,
    )
