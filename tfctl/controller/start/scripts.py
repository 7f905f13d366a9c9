"""The Python script a task's command runs, and what it imports, where tfctl can tell.

Preflight reads them on this machine before anything starts: a script the command names that
is not in the workdir (`python trian.py`) fails every task seconds after the start, and a
module the tasks' Python lacks (`import numpy` in an image without it) fails them with
`ModuleNotFoundError`. Both are said before the start instead, as `check` and `up` say them.
Only this machine's workdir is read: what the hosts' Pythons have is theirs to say.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from tfctl.config.model import ClusterConfig
from tfctl.errors import StartupError

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_TAKES_VALUE = {"-W", "-X", "-Q"}  # the interpreter options whose value is the next word
_NOT_A_SCRIPT = {"-m", "-c", "-"}  # a module, inline code or stdin: no file to look for
_SHELL_WORDS = {"&&", "||", ";", "|", "exec", "env", "nohup", "time"}


@dataclass(frozen=True)
class Script:
    """The script a job's command runs: as the command names it, and where it is here."""

    job: str
    named: str  # as the command has it, relative to the workdir
    path: Path
    # Run by `{python}`, the interpreter preflight asks: only then are its imports looked for
    # (`python3 train.py` is whichever python3 the task's PATH finds first).
    by_known_python: bool = False


def script_named(command: str) -> tuple[str, str] | None:
    """The relative `.py` path the command's Python runs and the word that runs it (`{python}
    -u train.py --x` -> (`train.py`, `{python}`); `./train.py`, run by its shebang, runs
    itself); None when it runs none tfctl can tell (a module, inline code, a path made by the
    shell, an absolute path, another program)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for at, word in enumerate(words):
        if word in _SHELL_WORDS or "=" in word and not word.startswith("-"):
            continue  # `cd x && python a.py`, `env A=b python a.py`
        if word != "{python}" and not _PYTHON.fullmatch(os.path.basename(word)):
            if word.endswith(".py") and at == 0:
                return (word, word) if _relative(word) else None
            continue
        rest = iter(words[at + 1 :])
        for arg in rest:
            if arg in _NOT_A_SCRIPT:
                return None
            if arg in _TAKES_VALUE:
                next(rest, None)
            elif not arg.startswith("-"):
                return (arg, word) if arg.endswith(".py") and _relative(arg) else None
        return None
    return None


def _relative(path: str) -> bool:
    """A path preflight can find under the workdir: relative, and not made by the shell."""
    return not path.startswith(("/", "~")) and not any(c in path for c in "${}*?")


def top_imports(source: str) -> list[str]:
    """The top-level modules a script imports unconditionally (at its top level, outside `try`
    and `if`), of the standard library none: the modules without which it cannot start. Empty
    on Python 3.9, which does not list its standard library, and for a file that does not parse."""
    stdlib = getattr(sys, "stdlib_module_names", None)
    if stdlib is None:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in stdlib and top != "__future__" and top not in found:
                found.append(top)
    return found


def scripts(config: ClusterConfig, workdir: Path) -> list[Script]:
    """Each job's script, where its command names one in `workdir`, in job order."""
    found = []
    for job in config.jobs:
        named = script_named(config.command_for(job))
        if named is not None:
            script, interpreter = named
            found.append(Script(job, script, workdir / script, interpreter == "{python}"))
    return found


def missing_scripts(config: ClusterConfig, found: list[Script], workdir: Path) -> StartupError | None:
    """What `up` says of scripts the commands name that are not in the workdir: every task of
    their jobs would fail at once with `can't open file`."""
    absent = [s for s in found if not s.path.is_file()]
    if not absent:
        return None
    present = sorted(str(p.relative_to(workdir)) for pattern in ("*.py", "*/*.py") for p in workdir.glob(pattern))
    lines: list[str] = []
    for s in absent:
        key = f"jobs.{s.job}.command" if config.jobs[s.job].command is not None else "command"
        near = difflib.get_close_matches(s.named, present, n=1)
        line = f"  {config.path}: {key}: runs {s.named}, which is not in the workdir {workdir}" + (
            f" (did you mean {near[0]}?)" if near else ""
        )
        if line not in lines:  # jobs sharing the top-level command: said once
            lines.append(line)
    return StartupError(
        f"the tasks' script{'s are' if len(lines) > 1 else ' is'} missing:\n" + "\n".join(lines),
        hint="fix the command, or set `workdir:` to the folder that holds the script (default: the cluster file's)",
    )


def imported_modules(found: list[Script], workdir: Path) -> dict[str, list[str]]:
    """job -> the modules its script needs from its Python: its top-level imports, less those
    the workdir itself holds (`import model` beside `model.py`)."""
    by_path: dict[Path, list[str]] = {}  # jobs sharing the top-level command share a script: read once
    needs: dict[str, list[str]] = {}
    for s in found:
        if not s.by_known_python:
            continue
        if s.path not in by_path:
            try:
                source = s.path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            local = {s.path.parent, workdir}
            by_path[s.path] = [
                m for m in top_imports(source) if not any((d / f"{m}.py").exists() or (d / m).is_dir() for d in local)
            ]
        needs[s.job] = by_path[s.path]
    return needs
