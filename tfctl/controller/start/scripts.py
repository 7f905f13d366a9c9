"""The Python script a task's command runs, and what it imports, where tfctl can tell.

Preflight reads them on this machine before anything starts: a script the command names that
is not in the workdir (`python trian.py`) fails every task seconds after the start, and a
module the tasks' Python lacks (`import numpy` in an image without it) fails them with
`ModuleNotFoundError`. Both are said before the start instead, as `check` and `up` say them.
Pure code: the caller reads the files.
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


def script_named(command: str) -> str | None:
    """The relative `.py` path the command's Python runs (`{python} -u train.py --x` ->
    `train.py`); None when it runs none tfctl can tell (a module, inline code, a path made by
    the shell, an absolute path, another program)."""
    found = script_and_interpreter(command)
    return None if found is None else found[0]


def script_and_interpreter(command: str) -> tuple[str, str] | None:
    """`script_named`'s script and the word that runs it (`{python}`, `python3`, the script itself)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    for at, word in enumerate(words):
        if word in _SHELL_WORDS or "=" in word and not word.startswith("-"):
            continue  # `cd x && python a.py`, `env A=b python a.py`
        if word != "{python}" and not _PYTHON.fullmatch(os.path.basename(word)):
            if word.endswith(".py") and at == 0:
                return _with(_relative(word), word)  # `./train.py`, run by its shebang
            continue
        rest = iter(words[at + 1 :])
        for arg in rest:
            if arg in _NOT_A_SCRIPT:
                return None
            if arg in _TAKES_VALUE:
                next(rest, None)
            elif not arg.startswith("-"):
                return _with(_relative(arg), word) if arg.endswith(".py") else None
        return None
    return None


def _with(script: str | None, interpreter: str) -> tuple[str, str] | None:
    return None if script is None else (script, interpreter)


def _relative(path: str) -> str | None:
    if path.startswith(("/", "~")) or any(c in path for c in "${}*?"):
        return None
    return path


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
        named = script_and_interpreter(config.command_for(job))
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
    needs: dict[str, list[str]] = {}
    for s in found:
        if not s.by_known_python:
            continue
        try:
            source = s.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        local = {s.path.parent, workdir}
        needs[s.job] = [
            m for m in top_imports(source) if not any((d / f"{m}.py").exists() or (d / m).is_dir() for d in local)
        ]
    return needs
