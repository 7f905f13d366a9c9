"""The documentation covers what the code has, and what it shows works: every cluster-file key and
every command-line option has a reference entry, every command marked runnable runs, and every
cluster file shown is one tfctl accepts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from tfctl.cli import cli
from tfctl.config.loader import parse_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import tfctl_errors  # noqa: E402
import tfctl_keys  # noqa: E402
import tfctl_reference  # noqa: E402

PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
PAGES = [page for page in PAGES if "_build" not in page.parts]
# A fenced block: its opening line's language, its text, and the line before the fence.
FENCE_RE = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```", re.S)


def fences(lang: str) -> list[tuple[str, str, str]]:
    """(page, the line before the fence, its text) of every block fenced as `lang`."""
    found = []
    for page in PAGES:
        for match in FENCE_RE.finditer("\n" + page.read_text()):
            if match["lang"] == lang:
                found.append((str(page.relative_to(ROOT)), match["before"].strip(), match["body"]))
    return found


def commands(group: click.Group, prefix: str = "tfctl") -> list[tuple[str, click.Command]]:
    """Every command under `group` a user sees, nested groups included, with the words that call it
    (hidden ones, such as the detached watcher's entry point, are not the user's)."""
    found: list[tuple[str, click.Command]] = [(prefix, group)]
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        if isinstance(command, click.Group):
            found += commands(command, f"{prefix} {name}")
        else:
            found.append((f"{prefix} {name}", command))
    return found


def test_every_cluster_file_key_has_a_reference_entry() -> None:
    rows = tfctl_keys.key_rows()
    assert len(rows) > 40, "the generator found too few keys to be reading the validators"
    assert [row.path for row in rows if not row.doc.strip()] == [], "add a line to the KEY_DOCS beside each key"
    stale = set(tfctl_keys.documented()) - {row.path for row in rows}
    assert stale == set(), "KEY_DOCS documents keys the cluster file no longer has"
    assert [row.path for row in rows if "\n" in row.doc] == [], "a key's doc is one line"


def test_every_command_and_option_has_help() -> None:
    missing = []
    for words, command in commands(cli):
        if not (command.help or command.short_help):
            missing.append(words)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip():
                missing.append(f"{words} {param.opts[0]}")
    assert missing == [], "the command-line reference shows these with no text: give them help="


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for the module as CI builds it (warnings are errors). Sphinx is in the
    `test` extra, so this never skips where the README's test command ran."""
    out = tmp_path_factory.mktemp("docs") / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_the_built_reference_lists_every_key_and_option(built: Path) -> None:
    out = built
    keys_page = (out / "reference" / "cluster-file.html").read_text()
    assert [
        r.path
        for r in tfctl_keys.key_rows()
        if f">{r.path.replace('<', '&lt;').replace('>', '&gt;')}<" not in keys_page
    ] == []
    cli_page = (out / "reference" / "cli.html").read_text()
    absent = [
        f"{words} {opt}"
        for words, command in commands(cli)
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden
        for opt in param.opts
        if opt not in cli_page
    ]
    assert absent == []
    assert [words for words, _ in commands(cli) if f">{words.split()[-1]}<" not in cli_page] == []


def test_the_shipped_references_are_current() -> None:
    """They are committed so that GitHub shows them too; a key, option or error added since makes
    them stale until regenerated."""
    assert tfctl_reference.stale() == [], f"run {tfctl_reference.COMMAND}"
    for page in tfctl_reference.PAGES:
        assert tfctl_reference.MARKER in (DOCS / page).read_text(), page
    assert "| `jobs.<job>.command` |" in (DOCS / "reference" / "cluster-file.md").read_text()
    assert "tfctl up [OPTIONS]" in (DOCS / "reference" / "cli.md").read_text()


# A dash a typesetter made of `--` (or `-`), before an option name: copied, the command fails.
TYPESET_OPTION_RE = re.compile(r"[\u2010-\u2015\u2212]+[a-z][a-z-]*")


def test_the_built_pages_keep_every_option_dash(built: Path) -> None:
    typeset = [
        f"{page.relative_to(built)}: {match[0]}"
        for page in sorted(built.rglob("*.html"))
        for match in TYPESET_OPTION_RE.finditer(page.read_text())
    ]
    assert typeset == [], "an en or em dash where `--` belongs"


# What the source says where the message has a value: `<FIX>`, `<', '.join(...)>`, `<self.host>`.
SOURCE_HOLE_RE = re.compile(r"&lt;(?:[A-Z_][A-Z0-9_]*|['\"(]|[a-z_]+\.[a-z_])")


def test_the_errors_page_shows_messages_by_what_the_user_did(built: Path) -> None:
    page = (built / "troubleshooting.html").read_text()
    assert SOURCE_HOLE_RE.findall(page) == [], "a constant's value or a named hole (‹host›) where the source is"
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "‹host›: unknown host key for ‹host name›" in text
    assert "ProxyJump chain longer than 8 hops" in text
    assert "tfctl.transport" not in page, "errors grouped by module, not by what the user was doing"
    other = [f"{e.module}:{e.line}" for e in tfctl_errors.raised_errors() if e.topic == tfctl_errors.OTHER]
    assert other == [], "add the module to a topic in docs/_ext/tfctl_errors.py's TOPICS"


RUNNABLE = [
    (page, line) for page, before, body in fences("sh") if before == "<!-- runnable -->" for line in body.splitlines()
]


def test_the_docs_mark_commands_runnable() -> None:
    assert len(RUNNABLE) >= 3


@pytest.mark.parametrize(("page", "command"), RUNNABLE, ids=[command for _, command in RUNNABLE])
def test_a_runnable_command_runs(page: str, command: str, tmp_path: Path) -> None:
    """Run from a scratch directory that holds the example cluster file, as a reader's clone does."""
    (tmp_path / "cluster.yaml.example").symlink_to(ROOT / "cluster.yaml.example")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "TFCTL_HOME": str(tmp_path / "home"),
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{page}: `{command}` exited {result.returncode}: {result.stderr[-2000:]}"


CLUSTER_FILES = [
    (page, body) for page, before, body in fences("yaml") if "jobs:" in body and before != "<!-- config-error-file -->"
]


def test_the_docs_show_cluster_files() -> None:
    assert len(CLUSTER_FILES) >= 4


@pytest.mark.parametrize(("page", "text"), CLUSTER_FILES, ids=[page for page, _ in CLUSTER_FILES])
def test_a_cluster_file_shown_is_valid(page: str, text: str) -> None:
    """A fragment (no `name`) is read with the least a file needs around it: a name and a command."""
    keys = yaml.safe_load(text)
    head = "" if "name" in keys else "name: example\n"
    head += "" if "command" in keys or "name" in keys else "command: python train.py\n"
    config = parse_config(head + text, ROOT / "cluster.yaml")
    assert config.jobs, page
