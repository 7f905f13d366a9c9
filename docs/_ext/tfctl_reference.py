"""The generated references as plain Markdown, committed, so they read on GitHub as on the site.

`docs/reference/cli.md` (every verb's `--help`), `docs/reference/cluster-file.md` (every key, from
`tfctl_keys`) and the list of errors of `docs/troubleshooting.md` (from `tfctl_errors`) are written
below each page's `MARKER` line; what is above it is written by hand. After adding a key, an
option or an error, run `python docs/_ext/tfctl_reference.py`; `--check` (and the Sphinx build,
as a warning) says which page is stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

import click  # noqa: E402
import tfctl_errors  # noqa: E402
import tfctl_keys  # noqa: E402

DOCS = Path(__file__).resolve().parents[1]
COMMAND = "python docs/_ext/tfctl_reference.py"
MARKER = f"<!-- Generated from the code below this line by `{COMMAND}`: do not edit it by hand. -->"
WIDTH = 100  # of the `--help` texts, whatever the terminal that regenerates them


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, `|` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    """`text` as inline code, fenced with enough backticks for those it holds."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if fence != "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _prose(text: str) -> str:
    """A hint for a table: its `code` kept, Markdown's own signs in the rest escaped."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(part if i % 2 else re.sub(r"([\\*\[\]<])", r"\\\1", part) for i, part in enumerate(parts))


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(_cell(cell) for cell in line) + " |" for line in lines)


def keys_text() -> str:
    rows = tfctl_keys.key_rows()
    sections = []
    for section in dict.fromkeys(row.section for row in rows):
        cells = [[_code(r.path), r.type, r.default, r.doc] for r in rows if r.section == section]
        title = _code(section) if section else "Top-level keys"
        sections.append(f"## {title}\n\n" + _table(["key", "type", "default", "meaning"], cells))
    return "\n\n".join(sections)


def _settings(command: click.Command) -> dict[str, Any]:
    """A context as `tfctl VERB --help` makes it (the command's own settings: `-h` as well as
    `--help`), at the page's width. Without them the help differed with whether the CLI had run
    in this process before: click keeps each command's help option once made."""
    return {**command.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}


def _commands(group: click.Group, ctx: click.Context) -> list[click.Context]:
    found = [ctx]
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx, **_settings(command))
        found += _commands(command, sub) if isinstance(command, click.Group) else [sub]
    return found


def cli_text() -> str:
    """Every verb's `--help`, as `tfctl VERB --help` prints it."""
    from tfctl.cli import cli

    root = click.Context(cli, info_name="tfctl", **_settings(cli))
    return "\n\n".join(
        f"## {_code(ctx.command_path)}\n\n```text\n{ctx.command.get_help(ctx)}\n```" for ctx in _commands(cli, root)
    )


def errors_text() -> str:
    errors = tfctl_errors.raised_errors()
    sections = []
    for title in [*(title for title, _, _ in tfctl_errors.TOPICS), tfctl_errors.OTHER]:
        rows = [[_code(" ".join(e.message.split())), _prose(e.hint) or "–"] for e in errors if e.topic == title]
        if rows:
            sections.append(f"### {title}\n\n" + _table(["what tfctl prints", "hint: the fix"], rows))
    return "\n\n".join(sections)


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_text,
    "reference/cluster-file.md": keys_text,
    "troubleshooting.md": errors_text,
}


def rendered(page: str) -> str:
    """The page as it should be: its hand-written part up to `MARKER`, then the generated text."""
    text = (DOCS / page).read_text()
    head = text.split(MARKER)[0].rstrip("\n")
    return f"{head}\n\n{MARKER}\n\n{PAGES[page]()}\n"


def stale() -> list[str]:
    """The generated pages whose committed text is not what the code now says."""
    return [page for page in PAGES if (DOCS / page).read_text() != rendered(page)]


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        for page in stale():
            print(f"docs/{page} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if stale() else 0
    for page in PAGES:
        (DOCS / page).write_text(rendered(page))
    return 0


def setup(app: Any) -> dict[str, Any]:
    """Warn (an error under `-W`) when a committed reference is stale."""
    from sphinx.util import logging

    def check(_app: Any) -> None:
        for page in stale():
            logging.getLogger(__name__).warning("docs/%s is stale: run %s", page, COMMAND)

    app.connect("builder-inited", check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.exit(main(sys.argv))
