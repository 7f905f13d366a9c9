"""The layout shows the architecture, and stays that way: floors that import only downwards, no
import cycle, a small top level, backends reached only through their interface, short modules."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tfctl"

# Lowest first. A module may import its own floor and those below, never one above. The registry
# (what is loaded by name: the backends) and each backend's cluster-file keys sit low
# (tfctl.config reads them); the backends themselves sit above the hosts they run on.
FLOORS = [
    ("supervisor",),  # stdlib only, shipped to the hosts
    ("errors", "trace", "console", "registry"),
    ("config", "backends.*.settings"),
    ("transport",),
    ("runs",),
    ("engine",),  # the run's decisions, pure: below the cluster that carries them out
    ("cluster",),
    ("backends.*",),
    ("tf",),
    ("tracking",),  # experiment trackers (MLflow, W&B): the runs a run logs into, over HTTP
    ("kube",),  # exports to Kubernetes: the cluster file and TF's task layout, as manifests
    ("controller",),
    ("api",),  # the Python API: what `import tfctl` offers, and what the CLI's verbs call
    ("cli", "__main__", ""),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def floor_of(module: str) -> int:
    best, best_len = -1, -1
    for number, patterns in enumerate(FLOORS):
        for pattern in patterns:
            regex = "" if pattern == "" else "^" + re.escape(pattern).replace(r"\*", r"[^.]+") + r"(\.|$)"
            exact = pattern == ""
            hit = module == pattern if exact else re.match(regex, module) is not None
            if hit and len(pattern) > best_len:
                best, best_len = number, len(pattern)
    assert best >= 0, f"tfctl.{module} is on no floor: add its package to FLOORS"
    return best


def imports(path: Path) -> set[str]:
    """Modules of tfctl this file imports, anywhere: in a function, and under `if TYPE_CHECKING:`
    too (a type named across floors is a dependency all the same; skipping those once hid an
    8-module loop through the backend registry)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tfctl":
            base = node.module.removeprefix("tfctl").removeprefix(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if is_module(sub) else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("tfctl.") for a in node.names if a.name.startswith("tfctl.")}
    return found


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = [
        f"tfctl.{m} (floor {floor_of(m)}) imports tfctl.{i} (floor {floor_of(i)})"
        for m, path in sorted(all_modules().items())
        for i in sorted(imports(path))
        if floor_of(i) > floor_of(m)
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    """The package itself ("") is left out as a target: every module imports it before its own
    first line, so reading `__version__` from it is no cycle."""
    graph = {m: {i for i in imports(p) if i not in (m, "")} for m, p in all_modules().items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_top_level_is_small() -> None:
    """19: the Kubernetes exports left `tf/` for a package of their own (`kube/`), since they are
    no TensorFlow knowledge but a way out of tfctl; the backend registry left `backends/` for
    `registry/`, so that the folder the config reads is on the floor it sits on; the Python
    API (`api/`) is a floor of its own between the controller and the command line built on it;
    and the experiment trackers (`tracking/`), another way out, speak HTTP to servers of their own.
    Each entry still says one concern. (`py.typed` is no concern but PEP 561's marker: it tells
    type checkers to read the API's annotations.)"""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("__pycache__", "py.typed"))
    assert len(entries) <= 19, entries


def test_generic_code_never_names_a_backend() -> None:
    """Only the registry and the interface's own docs may name Slurm outside its package."""
    naming = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "slurm" in p.read_text().lower() and "backends/slurm" not in str(p.relative_to(PACKAGE))
    )
    assert naming == ["backends/__init__.py", "backends/base.py", "registry/backends.py"]
    branches = [
        f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for p in PACKAGE.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"backend\s*[!=]=\s*[\"']", line) and not str(p.relative_to(PACKAGE)).startswith("backends/")
    ]
    assert branches == []


def test_the_live_controller_renders_nothing() -> None:
    """A run's live controller (the detached watcher and its door) gathers what `status` shows as
    plain data; the terminal that asked renders it. So it loads no renderer, and no rich."""
    live = ["watcher", "rpc_handlers", "driver", "spares", "resubmit", "notify"]
    code = (
        "import sys, importlib\n"
        f"for name in {live!r}: importlib.import_module('tfctl.controller.live.' + name)\n"
        "importlib.import_module('tfctl.controller.views.status_view')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'"
        " or m.startswith('tfctl.controller.views.') and m.rsplit('.', 1)[1] not in ('status_view', 'plain')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_short(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 600


def folder_of(module: str) -> str:
    """The package a module sits in ("" for the top level); a package's own `__init__` counts
    as in that package."""
    path = PACKAGE.joinpath(*module.split("."))
    return module if (path / "__init__.py").exists() else module.rpartition(".")[0]


def test_no_import_cycle_between_folders() -> None:
    """As between modules, so between the folders that hold them: `controller/live` and
    `controller/verbs` once imported each other, and `config` the registry inside `backends`,
    which no module cycle showed. The top level ("") is left out: it holds the lowest modules
    (errors, console) and the entry point both."""
    graph: dict[str, set[str]] = {}
    for module, path in all_modules().items():
        mine = folder_of(module)
        graph.setdefault(mine, set()).update(folder_of(i) for i in imports(path))
    graph = {a: {b for b in deps if b not in (a, "")} for a, deps in graph.items() if a}
    loops = []
    state: dict[str, int] = {}

    def visit(folder: str, stack: list[str]) -> None:
        state[folder] = 1
        for dep in sorted(graph.get(folder, ())):
            if state.get(dep) == 1:
                loops.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[folder] = 2

    for folder in sorted(graph):
        if folder not in state:
            visit(folder, [folder])
    assert loops == []
