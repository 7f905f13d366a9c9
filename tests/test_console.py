"""When tfctl colours its output: NO_COLOR, FORCE_COLOR, dumb terminals, pipes."""

from __future__ import annotations

import io

import pytest

from tfctl.console import color_enabled
from tfctl.logs import Prefixer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "env,stream,expected",
    [
        ({}, Terminal(), True),
        ({}, io.StringIO(), False),
        ({"TERM": "dumb"}, Terminal(), False),
        ({"NO_COLOR": "1"}, Terminal(), False),
        ({"FORCE_COLOR": "1"}, io.StringIO(), True),
        ({"FORCE_COLOR": "1", "TERM": "dumb"}, Terminal(), True),
        ({"FORCE_COLOR": "0"}, io.StringIO(), False),
        ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, Terminal(), False),
    ],
)
def test_color_rules(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], stream: io.StringIO, expected: bool) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert color_enabled(stream) is expected


def test_prefixes_are_plain_without_colour_and_aligned() -> None:
    plain = Prefixer(["ps:0", "worker:10"], color=False)
    assert plain("ps:0", "x") == "[ps:0]      x"
    assert plain("worker:10", "y") == "[worker:10] y"
    coloured = Prefixer(["ps:0"], color=True)
    assert coloured("ps:0", "x").startswith("\x1b[") and coloured("ps:0", "x").endswith("\x1b[0m x")
