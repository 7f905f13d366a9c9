"""When tfctl colours its output: NO_COLOR, FORCE_COLOR, dumb terminals, pipes; for rich's output
and the log prefixes alike, decided in one place."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tests.conftest import fake, free_ports, tfctl
from tfctl.cluster.output import Prefixer
from tfctl.console import color_enabled, make_console


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# (environment, stream is a terminal, colour expected)
COMBINATIONS = [
    ({}, True, True),
    ({}, False, False),
    ({"TERM": "dumb"}, True, False),
    ({"TERM": "xterm-256color"}, True, True),
    ({"NO_COLOR": "1"}, True, False),
    ({"NO_COLOR": "0"}, True, False),  # any non-empty value
    ({"NO_COLOR": ""}, True, True),  # empty counts as unset (no-color.org)
    ({"FORCE_COLOR": "1"}, False, True),
    ({"FORCE_COLOR": "3"}, False, True),
    ({"FORCE_COLOR": "1", "TERM": "dumb"}, True, True),
    ({"FORCE_COLOR": "1", "TERM": "dumb"}, False, True),
    ({"FORCE_COLOR": "0"}, False, False),
    ({"FORCE_COLOR": ""}, False, False),
    ({"FORCE_COLOR": "0"}, True, True),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, True, False),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False, False),
]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch):
    def set_env(values: dict[str, str]) -> None:
        for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize("values,tty,expected", COMBINATIONS)
def test_one_decision_for_rich_output_and_log_prefixes(env, values: dict[str, str], tty: bool, expected: bool) -> None:
    env(values)
    stream = Terminal() if tty else io.StringIO()
    assert color_enabled(stream) is expected

    console = make_console(stream)
    console.print("[red]error:[/red] text")
    assert ("\x1b[" in stream.getvalue()) is expected
    assert re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue()) == "error: text\n"

    prefix = Prefixer(["ps:0", "worker:1"], color_enabled(stream))
    line = prefix("worker:1", "step 1")
    assert ("\x1b[" in line) is expected
    assert line.endswith(" step 1")


@pytest.mark.parametrize("values", [{"FORCE_COLOR": "1"}, {"FORCE_COLOR": "1", "TERM": "dumb"}])
def test_forced_colour_into_a_pipe_is_not_a_terminal(env, values: dict[str, str]) -> None:
    """Colour, but no spinners or live redraws in a file."""
    env(values)
    console = make_console(io.StringIO())
    assert console.color_system == "standard" and not console.is_terminal and not console.is_interactive


def test_prefixes_are_plain_without_colour_and_aligned() -> None:
    plain = Prefixer(["ps:0", "worker:10"], color=False)
    assert plain("ps:0", "x") == "[ps:0]      x"
    assert plain("worker:10", "y") == "[worker:10] y"
    coloured = Prefixer(["ps:0", "worker:10"], color=True)
    assert coloured("ps:0", "x") == "\x1b[36m[ps:0]     \x1b[0m x"
    assert coloured("worker:10", "y") == "\x1b[33m[worker:10]\x1b[0m y"  # the next colour


@pytest.mark.parametrize(
    "values,expected",
    [
        ({}, False),
        ({"FORCE_COLOR": "1"}, True),
        ({"FORCE_COLOR": "1", "TERM": "dumb"}, True),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ({"TERM": "dumb"}, False),
    ],
)
def test_the_cli_colours_prefixes_and_messages_alike(
    tmp_path: Path, home: Path, values: dict[str, str], expected: bool
) -> None:
    cluster = tmp_path / "cluster.yaml"
    port = free_ports(1)[0]
    cluster.write_text(f'name: c\ncommand: "{fake("--name w --lines 1")}"\njobs:\n  worker: [localhost:{port}]\n')
    clean = {"NO_COLOR": "", "FORCE_COLOR": "", "TERM": "xterm"}
    up = tfctl("up", "-f", str(cluster), home=home, env={**clean, **values})  # piped, as in every test
    assert up.returncode == 0, up.stderr
    worker_lines = [line for line in up.stdout.splitlines() if "w line 0" in line]
    assert len(worker_lines) == 1
    assert ("\x1b[" in worker_lines[0]) is expected
    assert ("\x1b[" in up.stderr) is expected  # "job succeeded" is green
    bad = tfctl("-f", str(tmp_path / "missing.yaml"), "up", home=home, env={**clean, **values})
    assert bad.returncode == 2 and ("\x1b[" in bad.stderr) is expected
