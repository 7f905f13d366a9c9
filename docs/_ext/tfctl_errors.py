"""Every error tfctl raises to the user, with its fix, found in the source so the list cannot drift.

Scans `tfctl/` for every `X(...)` where X is `TfctlError` or a subclass of it (found by reading
the class definitions), and takes the message and the `hint` as a user reads them: text stays
text, a module constant shows its value, and any other `{expression}` of an f-string is a named
hole (`‹host›`), filled in when the error is printed.
Errors whose whole text is made at run time (relayed from a host's
supervisor or a run's controller, where they are listed) are left out. Mistakes in a cluster
file are not here either: each is reported with its file, line, key and fix, all at
once (see the guide). `tfctl_reference` writes one table per topic (`TOPICS`) into
`docs/troubleshooting.md`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tfctl"


# What the user was doing when an error comes, in the order a run meets them: the first topic
# whose words the message holds, or whose module prefix the error's module has, takes it.
TOPICS = [
    (
        "Creating a project and finding the cluster file",
        ("tfctl.cli.app", "tfctl.cli.prepare", "tfctl.tf.templates"),
        ("cluster.yaml in",),
    ),
    (
        "Connecting to hosts",
        ("tfctl.transport.ssh", "tfctl.transport.local", "tfctl.cluster.agent", "tfctl.cluster.group"),
        (),
    ),
    ("Giving parameters (`--set`)", ("tfctl.config.params",), ()),
    ("Containers", (), ("container",)),
    ("Slurm", ("tfctl.backends.slurm",), ()),
    (
        "Pools (`pool:`, `tfctl pool`)",
        ("tfctl.cluster.pooling", "tfctl.controller.verbs.pool", "tfctl.config.pool"),
        ("hands it out", "which lets tasks run on"),
    ),
    ("Experiment tracking (`tracking:`)", ("tfctl.tracking", "tfctl.controller.live.tracked"), ()),
    (
        "Sweeps (`sweep`, `down --sweep`)",
        ("tfctl.controller.verbs.sweep", "tfctl.runs.sweeps", "tfctl.cli.sweep", "tfctl.config.sweep_flags"),
        (),
    ),
    (
        "Starting a run (`up`)",
        (
            "tfctl.controller.verbs",
            "tfctl.controller.start",
            "tfctl.controller.live.launch",
            "tfctl.cluster.cluster",
            "tfctl.cluster.control",
            "tfctl.runs.transitions",
        ),
        ("already taken",),
    ),
    ("Following or stopping a run", ("tfctl.controller.live",), ()),
    ("Running a command on a task's host (`exec`, `ssh`)", ("tfctl.cli.reach", "tfctl.cluster.reach"), ()),
    ("TensorBoard and the report", ("tfctl.tf.tensorboard", "tfctl.transport.forward"), ("report",)),
    ("Naming a run or a task (`status`, `logs`, `down`, `runs`)", ("tfctl.cli", "tfctl.runs.store"), ()),
    ("Exporting to Kubernetes", ("tfctl.kube",), ()),
    ("From Python (`import tfctl`)", ("tfctl.api",), ()),
]
OTHER = "Other errors"


def topic(module: str, message: str) -> str:
    """The topic an error is listed under (`TOPICS`)."""
    for title, prefixes, words in TOPICS:
        if any(word in message for word in words) or any(module.startswith(p) for p in prefixes):
            return title
    return OTHER


@dataclass(frozen=True)
class RaisedError:
    module: str  # tfctl.controller.verbs.up
    line: int
    kind: str  # the exception class
    message: str
    hint: str

    @property
    def topic(self) -> str:
        return topic(self.module, self.message)


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


# Holes whose expression's own name would not tell a user what goes there.
_NAMES = {
    "e": "reason",
    "err": "reason",
    "error": "reason",
    "strerror": "reason",
    "text": "reason",
    "detail": "reason",
    "said": "what Slurm said",
    "run_id": "run id",
    "cluster_file": "cluster file",
    "config.path": "cluster file",
    "cluster_name": "cluster name",
    "config.name": "cluster name",
    "_ssh_config_path": "ssh config",
    "ep": "host",
    "via": "jump host",
    "alias": "host",
    "hostname": "host name",
    "argv": "command",
    "lines": "one line per failure",
    "failures": "one line per failed connection",
    "last_lines_text": "its last lines",
    "describe_end": "how it ended",
    "_fingerprint": "fingerprint",
    "hint": "what to do",
    "tried": "the keys tried",
    "len": "count",
    "id": "request id",
}


def _name(node: ast.expr) -> str:
    """A named hole for what an f-string fills in: the thing's name, as a user calls it."""
    if isinstance(node, (ast.Attribute, ast.Name)):
        words = ast.unparse(node).removeprefix("self.")
        last = node.attr if isinstance(node, ast.Attribute) else node.id
        return _NAMES.get(words) or _NAMES.get(last) or last.strip("_").replace("_", " ").lower()
    if isinstance(node, ast.Subscript):
        key = node.slice
        return (
            _NAMES.get(key.value, key.value)
            if isinstance(key, ast.Constant) and isinstance(key.value, str)
            else _name(node.value)
        )
    if isinstance(node, ast.BoolOp):
        return _name(node.values[0])
    if isinstance(node, ast.IfExp):
        return _name(node.body)
    if isinstance(node, ast.GeneratorExp):
        return _name(node.elt)
    if isinstance(node, ast.BinOp):
        return "size" if isinstance(node.op, ast.Div) else "seconds"
    if isinstance(node, ast.Call):
        func = node.func.attr if isinstance(node.func, ast.Attribute) else ast.unparse(node.func)
        if func in _NAMES:
            return _NAMES[func]
        if func == "get" and isinstance(node.args[0], ast.Constant):
            word = str(node.args[0].value)
            return _NAMES.get(word, word)
        if func == "join" and isinstance(node.args[0], ast.GeneratorExp):
            return "list"
        if node.args and func in {"str", "getattr", "describe", "join"}:
            return _name(node.args[0])
        if isinstance(node.func, ast.Attribute) and not node.args:
            inner = _name(node.func.value)
            if func == "failure":
                return "reason"
            return inner if func in {"strip", "text"} else func.strip("_").replace("_", " ")
    return "value"


def _text(node: ast.expr | None, constants: dict[str, ast.expr]) -> str:
    """A message as a user reads it: literal text; a module constant's value; any other f-string
    field as a named hole (`‹host›`), filled in when it is printed."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        value = node.value
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(node, ast.Name) and node.id in constants:
        return _text(constants[node.id], constants)
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(value, constants) for value in node.values)
    if isinstance(node, ast.FormattedValue):
        return _text(node.value, constants)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left, constants) + _text(node.right, constants)
    if isinstance(node, ast.IfExp) and isinstance(node.body, (ast.Constant, ast.JoinedStr)):
        return _text(node.body, constants)  # one of its two texts, as an example
    return f"‹{_name(node)}›"


def _constants(trees: dict[str, ast.Module]) -> dict[str, dict[str, ast.expr]]:
    """Per module, its UPPER_CASE module-level constants, its own and those it imports."""
    own = {
        module: {
            target.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name) and target.id.isupper()
        }
        for module, tree in trees.items()
    }
    found = {}
    for module, tree in trees.items():
        names = dict(own[module])
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = module.split(".")[: len(module.split(".")) - node.level] if node.level else []
                source = ".".join([*base, *(node.module or "").split(".")]).strip(".")
                names.update({a.name: own[source][a.name] for a in node.names if a.name in own.get(source, {})})
        found[module] = names
    return found


def raised_errors() -> list[RaisedError]:
    """Every tfctl error the package makes (raised there or later), in module and line order."""
    trees = {
        ".".join(("tfctl", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): ast.parse(
            path.read_text()
        )
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    classes = _error_classes(trees)
    constants = _constants(trees)
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
                prefix, args = f"{_text(args[0], {})}: ", args[1:]
            message = prefix + _text(args[0] if args else None, constants[module])
            if not re.sub(r"‹[^‹›]*›", "", message).strip(" :"):
                continue  # all of it made at run time: an error relayed from elsewhere (a host, the controller)
            hints = [k.value for k in node.keywords if k.arg == "hint"]
            hint = _text(hints[0] if hints else (args[1] if len(args) > 1 else None), constants[module])
            found.append(RaisedError(module, node.lineno, kind, message, hint))
    return sorted(found, key=lambda e: (e.module, e.line))
