"""`tfctl init`: copy a ready-to-run cluster file and training script into a project.

Templates live in the repository's top-level `templates/` (a source checkout or an editable
install) or, for a wheel, under `<prefix>/share/tfctl/templates`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tfctl.errors import UsageError

DEFAULT_TEMPLATE = "between-graph-async"


def templates_dir() -> Path:
    for candidate in (
        Path(__file__).resolve().parents[2] / "templates",
        Path(sys.prefix) / "share" / "tfctl" / "templates",
    ):
        if candidate.is_dir():
            return candidate
    raise UsageError("tfctl's templates are not installed", hint="reinstall tfctl (pip install tfctl)")


def available() -> dict[str, str]:
    """Template name -> its one-line description (the title of its README)."""
    found = {}
    for path in sorted(templates_dir().iterdir()):
        readme = path / "README.md"
        if (path / "cluster.yaml").is_file():
            title = readme.read_text().splitlines()[0].lstrip("# ") if readme.is_file() else path.name
            found[path.name] = title.split(": ", 1)[-1]
    return found


def install(name: str, dest: Path | None, force: bool = False) -> tuple[Path, list[Path]]:
    """Copy template `name` into `dest`, else into a new directory named after it (as `cargo new`
    does, so the files never land among others by surprise); refuses to overwrite anything unless
    `force`. Returns the directory and the files written."""
    names = available()
    if name not in names:
        raise UsageError(f"no template {name!r}", hint=f"choose one of: {', '.join(names)}")
    if dest is None:
        dest = Path(name)
        if dest.exists() and not dest.is_dir():
            raise UsageError(
                f"{dest} is a file, and `init` writes a new directory named after the template",
                hint=f"name a directory: tfctl init -t {name} DIRECTORY (`.` for this one)",
            )
        if dest.is_dir() and any(dest.iterdir()) and not force:
            raise UsageError(
                f"{dest} already exists, and `init` writes a new directory named after the template",
                hint=f"name another: tfctl init -t {name} DIRECTORY (`.` for this one), "
                "or pass --force to write into it",
            )
    source = templates_dir() / name
    files = [p for p in sorted(source.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    targets = [dest / p.relative_to(source) for p in files]
    clashes = [t for t in targets if t.exists()]
    if clashes and not force:
        raise UsageError(
            f"{dest} already has {', '.join(str(c.relative_to(dest)) for c in clashes)}",
            hint="choose an empty directory, or pass --force to overwrite",
        )
    for src, target in zip(files, targets):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest, targets
