"""Every error tfctl raises to the user, with its fix, found in the source so the list cannot drift.

Scans `tfctl/` for every `X(...)` where X is `TfctlError` or a subclass of it (found by reading
the class definitions), and takes the message and the `hint` as written: text stays text, and each
`{expression}` of an f-string is shown as `<expression>`, the value filled in when it is printed.
Errors whose whole text is made at run time (relayed from a host's
supervisor or a run's controller, where they are listed) are left out. Mistakes in a cluster
file are not here either: each is reported with its file, line, key and fix, all at
once (see the guide). `{tfctl-errors}` renders one table per module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "tfctl"


@dataclass(frozen=True)
class RaisedError:
    module: str  # tfctl.controller.verbs.up
    line: int
    kind: str  # the exception class
    message: str
    hint: str


def _error_classes(trees: dict[str, ast.Module]) -> set[str]:
    """`TfctlError` and every class that derives from it, by name, however deep."""
    bases: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
    found = {"TfctlError"}
    while True:
        more = {name for name, parents in bases.items() if parents & found} - found
        if not more:
            return found
        found |= more


def _text(node: ast.expr | None) -> str:
    """A message as written: literal text, f-string fields as `<expression>`."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append(f"<{ast.unparse(value.value)}>")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return f"<{ast.unparse(node)}>"


def raised_errors() -> list[RaisedError]:
    """Every tfctl error the package makes (raised there or later), in module and line order."""
    trees = {
        ".".join(("tfctl", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): ast.parse(
            path.read_text()
        )
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    classes = _error_classes(trees)
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            kind = ast.unparse(node.func).rpartition(".")[2]
            if kind not in classes or kind == "ConfigError":
                continue
            args = list(node.args)
            prefix = ""
            if kind == "HostError" and args:  # (host, message, hint): printed as "host: message"
                prefix, args = f"<{ast.unparse(args[0])}>: ", args[1:]
            message = prefix + _text(args[0] if args else None)
            if not re.sub(r"<[^<>]*>", "", message).strip(" :"):
                continue  # all of it made at run time: an error relayed from elsewhere (a host, the controller)
            hints = [k.value for k in node.keywords if k.arg == "hint"]
            hint = _text(hints[0] if hints else (args[1] if len(args) > 1 else None))
            found.append(RaisedError(module, node.lineno, kind, message, hint))
    return sorted(found, key=lambda e: (e.module, e.line))


def setup(app: Any) -> dict[str, Any]:
    """Register `{tfctl-errors}`: one table per module that raises."""
    from docutils import nodes
    from sphinx.util.docutils import SphinxDirective
    from tfctl_keys import inline, table

    class ErrorsDirective(SphinxDirective):
        def run(self) -> list[nodes.Node]:
            errors = raised_errors()
            return [
                table(
                    module,
                    [55, 45],
                    ["what tfctl prints", "hint: the fix"],
                    [[[nodes.literal(text=e.message)], inline(e.hint or "–")] for e in errors if e.module == module],
                    "tfctl-errors",
                )
                for module in dict.fromkeys(e.module for e in errors)
            ]

    app.add_directive("tfctl-errors", ErrorsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
