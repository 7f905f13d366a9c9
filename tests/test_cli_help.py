"""What `--help` shows: whole one-line summaries, and an example for every verb."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfctl.cli import cli

VERBS = sorted(name for name, command in cli.commands.items() if not command.hidden)


def help_text(*args: str, columns: int = 80) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tfctl", *args, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": str(columns)},
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("columns", [80, 60])
def test_the_verb_list_shows_whole_summaries(columns: int) -> None:
    text = help_text(columns=columns)
    assert text.startswith("Usage: tfctl ")  # `python -m tfctl` too
    listing = text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    assert "..." not in listing
    flat = " ".join(listing.split())
    for verb in VERBS:
        summary = cli.commands[verb].short_help
        assert summary and len(summary) <= 60, verb  # one line on an 80-column screen
        assert f"{verb} {summary}" in flat


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_examples_that_fit_the_screen(verb: str) -> None:
    text = help_text(verb)
    assert text.startswith(f"Usage: tfctl {verb} ")
    examples = text.split("Examples:\n", 1)[1]
    lines = [line for line in examples.splitlines() if line.strip()]
    assert lines and all(line.strip().startswith("tfctl ") for line in lines)
    assert all(len(line) <= 80 for line in text.splitlines())
