"""A pull's progress reaches `up` as the runtime prints it: the supervisor sends each line as a
note before its answer (`supervisor.notes`), the host agent hands notes to whoever asked, and
`up` shows a host's latest line at most every PULLED_LINE_EVERY seconds. A stand-in podman on
PATH prints the pull's lines, so no runtime (and no root) is needed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tfctl.cluster.agent import HostAgent
from tfctl.controller.start.preflight import still_preparing
from tfctl.supervisor import notes
from tfctl.supervisor.protocol import ContainerLaunch, InfoRequest
from tfctl.transport.local import LocalTransport

PULL_LINES = ["Trying to pull example.org/team/train:1...", "Copying blob sha256:0123 done", "Writing manifest"]
# A podman with no image until pulled: its pull prints podman's lines on stderr, slowly enough
# that each is its own read; its `run` answers the preflight probe as an image's Python would.
STAND_IN = """#!/bin/sh
pulled="$(dirname "$0")/pulled"
case "$1" in
  image) [ -e "$pulled" ];;
  pull) for line in %(lines)s; do echo "$line" >&2; sleep 0.05; done; echo sha256:0123; touch "$pulled";;
  run) printf '3.11.2\\n/usr/bin/python3\\n\\n';;
  *) exit 3;;
esac
"""


@pytest.fixture
def podman_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    podman = bin_dir / "podman"
    podman.write_text(STAND_IN % {"lines": " ".join(f"'{line}'" for line in PULL_LINES)})
    podman.chmod(podman.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_a_pulls_lines_reach_the_caller_before_the_answer(podman_on_path: Path, tmp_path: Path) -> None:
    heard: list[str] = []
    box = ContainerLaunch("example.org/team/train:1", "podman", pull_timeout=30)
    with HostAgent(LocalTransport(), None, str(tmp_path / "host")) as agent:
        answer = agent.call(InfoRequest(container=box), on_note=heard.append)
        # stderr's lines in their order, and stdout's (read on a thread of its own) among them
        assert [line for line in heard if line != "sha256:0123"] == PULL_LINES and len(heard) == 4
        assert answer.container_fetched.startswith("pulled example.org/team/train:1 in ")
        assert answer.python == "3.11.2" and answer.container_error is None
        again: list[str] = []
        agent.call(InfoRequest(container=box), on_note=again.append)
    assert again == []  # pulled already: nothing to say
    assert (podman_on_path / "pulled").exists()


@pytest.mark.parametrize(
    "line, said",
    [
        (notes.PREFIX + json.dumps("Copying blob"), "Copying blob"),
        (notes.PREFIX + json.dumps("x" * 5000), "x" * notes.MOST),  # a peer's supervisor may send more
        (notes.PREFIX + "not json", None),
        (notes.PREFIX + json.dumps({"a": 1}), None),
        ('{"id": "1"}', None),  # an answer
        ("Last login: Mon", None),  # a shell's start-up noise
    ],
)
def test_what_a_line_of_the_conversation_says(line: str, said: str | None) -> None:
    assert notes.heard(line) == said


def test_a_note_is_bounded_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    notes.say("  Copying blob\r\n" + "y" * 1000 + "\n")
    notes.say("   ")  # nothing to say: no line
    (line,) = capsys.readouterr().out.splitlines()
    assert notes.heard(line) == ("Copying blob\r\n" + "y" * 1000)[: notes.MOST]


def test_up_shows_a_hosts_first_pull_line_at_once_and_not_every_line() -> None:
    shown: list[tuple[str, str]] = []
    with still_preparing(lambda who, what: shown.append((who, what)), ["h1", "h2"]) as heard:
        for n in range(50):  # a burst, as docker prints a layer's lines
            heard("h1", f"layer {n}: Downloading")
        heard("h2", "Trying to pull")
    assert shown == [("h1", "image: layer 0: Downloading"), ("h2", "image: Trying to pull")]
    with still_preparing(lambda who, what: shown.append((who, what)), []) as heard:
        heard("h1", "no container here")  # no host pulls: nothing is shown
    assert len(shown) == 2
