"""Task output is untrusted: what tfctl prints of it to a terminal obeys no control sequence,
while the stored log and piped output stay byte-exact."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.text import Text

from tests.conftest import free_ports
from tfctl import console
from tfctl.cluster.output import Prefixer
from tfctl.console import has_controls, inert, make_console, rendered, shown

CLIPBOARD = "\x1b]52;c;aGVsbG8=\x07"  # OSC 52: write the clipboard
TITLE = "\x1b]0;pwned\x07"  # OSC 0: set the window title
CLEAR = "\x1b[2J"  # CSI: clear the screen


@pytest.mark.parametrize(
    "line, shown",
    [
        (CLIPBOARD + "x", "^[]52;c;aGVsbG8=^Gx"),
        (TITLE + CLEAR + "ok", "^[]0;pwned^G^[[2Jok"),
        ("\x1bP1$r\x1b\\ dcs", "^[P1$r^[\\ dcs"),  # DCS
        ("\x9b2J c1", "M-^[2J c1"),  # the 8-bit CSI
        ("\x1b]0;never ended", "^[]0;never ended"),  # an OSC cut off by the line's end stays inert
        ("tab\tstays", "tab\tstays"),
        ("bell\x07 nul\x00 del\x7f", "bell^G nul^@ del^?"),
        ("txt.\u202egnp \u2066x\u2069", "txt.<U+202E>gnp <U+2066>x<U+2069>"),  # bidi overrides
    ],
)
def test_every_control_character_is_shown_not_obeyed(line: str, shown: str) -> None:
    assert inert(line) == shown
    assert not has_controls(inert(line).replace("\t", ""))


def test_colours_may_stay_with_a_reset_at_the_end_and_nothing_else_does() -> None:
    assert inert("\x1b[1;31mred" + CLEAR, keep_colour=True) == "\x1b[1;31mred^[[2J\x1b[0m"
    assert inert("\x1b[1;31mred", keep_colour=False) == "^[[1;31mred"
    assert inert("plain", keep_colour=True) == "plain"


class Screen(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("colour", [{"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}])
def test_whatever_a_rich_console_prints_is_inert_whoever_quotes_it(monkeypatch, colour: dict[str, str]) -> None:
    # the one boundary: a diagnosis, a status note or a notify line quoting a task, with or
    # without markup, as Text, or rendered for another terminal, obeys nothing it quotes
    for name, value in colour.items():
        monkeypatch.setenv(name, value)
    screen = Screen()
    shown = make_console(screen)
    shown.print(f"[red]failed[/red]: {TITLE}{CLEAR}all good \u202eevil", markup=True)
    shown.print(Text(CLIPBOARD + "x", style="bold link https://evil.example"))
    shown.print(f"{TITLE} \x9b2J", markup=False)
    other = rendered(Text(TITLE + "\u2067"), {"tty": True, "color": bool(colour.get("FORCE_COLOR")), "width": 80})
    for text in (screen.getvalue(), other):
        without_colours = re.sub(r"\x1b\[[0-9;]*m", "", text)
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", without_colours), text
    assert "^[]0;pwned" in screen.getvalue() and "<U+202E>evil" in screen.getvalue() and "^[]0;pwned<U+2067>" in other
    assert ("\x1b[31m" in screen.getvalue()) == bool(colour.get("FORCE_COLOR"))


def test_text_rendered_elsewhere_keeps_its_colours_and_nothing_else() -> None:
    # the status table a run's controller (perhaps of an older tfctl) rendered for this terminal
    table = "\x1b[1mTASK\x1b[0m  LAST LINE\nworker:0  " + TITLE + CLEAR + "\u202eok\tx\n"
    assert shown(table) == "\x1b[1mTASK\x1b[0m  LAST LINE\nworker:0  ^[]0;pwned^G^[[2J<U+202E>ok\tx\n"
    assert shown("plain\n\x1b[31mred\x1b[0m\n") == "plain\n\x1b[31mred\x1b[0m\n"


def test_the_prefixer_neutralises_for_a_terminal_only() -> None:
    lines = [("worker:0", ["fine", TITLE + "owned"])]
    assert "^[]0;pwned^Gowned" in Prefixer(["worker:0"], color=False, terminal=True).text(lines)
    assert TITLE in Prefixer(["worker:0"], color=False, terminal=False).text(lines)
    assert Prefixer(["worker:0"], color=False, terminal=True)("worker:0", CLEAR) == "[worker:0] ^[[2J"


def on_a_terminal(args: list[str], home: Path, timeout: float = 60) -> tuple[int, bytes]:
    """Run the CLI with its stdout on a pseudo-terminal, as a user's shell would; what it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfctl", *args],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TFCTL_HOME": str(home), "NO_COLOR": "1"},
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closed: the process is gone
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


def test_logs_and_status_on_a_terminal_obey_nothing_a_task_prints(tmp_path: Path, home: Path) -> None:
    hostile = CLIPBOARD + TITLE + CLEAR + "done"
    (port,) = free_ports(1)
    printer = tmp_path / "hostile.py"
    printer.write_text(f"import sys\nsys.stdout.write({hostile!r} + '\\n')\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"name: hostile\njobs:\n  worker:\n    hosts: [localhost:{port}]\n    command: '{{python}} {printer}'\n"
    )
    up = subprocess.run(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
        capture_output=True,
        timeout=120,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    assert up.returncode == 0, up.stderr
    assert hostile.encode() in up.stdout  # piped: as the task wrote it

    code, attached = on_a_terminal(["-f", str(cluster), "up"], home, timeout=120)
    assert code == 0 and b"[worker:0] ^[]52;c;aGVsbG8=^G" in attached and b"\x1b]" not in attached, attached

    code, shown = on_a_terminal(["-f", str(cluster), "logs"], home)
    assert code == 0 and b"[worker:0] ^[]52;c;aGVsbG8=^G^[]0;pwned^G^[[2Jdone" in shown, shown
    assert b"\x1b]" not in shown and b"\x1b[2J" not in shown

    code, raw = on_a_terminal(["-f", str(cluster), "logs", "--raw"], home)
    assert code == 0 and hostile.encode() in raw

    code, table = on_a_terminal(["-f", str(cluster), "status"], home)
    assert b"^[]52;c;" in table and b"\x1b]" not in table, table

    runs = json.loads(
        subprocess.run(
            [sys.executable, "-m", "tfctl", "runs", "--json"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "TFCTL_HOME": str(home)},
        ).stdout
    )
    stored = list(home.glob(f"hosts/*/tasks/{runs[-1]['run_id']}/worker-0/output.log"))
    assert [p.read_bytes() for p in stored] == [hostile.encode() + b"\n"]  # the log itself: byte-exact


PEAK_RSS = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
lines = done.stdout.split(bytes([10]))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, len(done.stdout), max(map(len, lines)))
"""


def logs_footprint(tmp_path: Path, home: Path, name: str, program: str) -> tuple[int, int, int]:
    """(peak RSS in KiB of `tfctl logs` printing a finished task's output, bytes printed, the
    longest line printed)."""
    (port,) = free_ports(1)
    script = tmp_path / f"{name}.py"
    script.write_text(program)
    cluster = tmp_path / f"{name}.yaml"
    command = f"{{python}} {script}"
    cluster.write_text(f"name: {name}\njobs:\n  worker:\n    hosts: [localhost:{port}]\n    command: '{command}'\n")
    env = {**os.environ, "TFCTL_HOME": str(home)}
    up = subprocess.run(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"], capture_output=True, env=env, timeout=120
    )
    assert up.returncode == 0, up.stderr
    argv = [sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "tfctl", "-f", str(cluster), "logs"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True)
    peak, printed, longest = map(int, done.stdout.split())
    return peak, printed, longest


def test_one_huge_line_costs_logs_no_more_memory_than_the_same_bytes_in_short_lines(tmp_path: Path, home: Path) -> None:
    """A task printing one 20 MB line: `tfctl logs` shows it in 64 KiB pieces and holds no more
    than a piece of it at a time (84 MB peak before, against 27 MB for short lines)."""
    size = 20_000_000
    long_line = f"import sys\nsys.stdout.write('x' * {size} + chr(10))\n"
    short_lines = f"import sys\nsys.stdout.write(('x' * 99 + chr(10)) * {size // 100})\n"
    one, one_printed, one_longest = logs_footprint(tmp_path, home, "long", long_line)
    short, short_printed, _ = logs_footprint(tmp_path, home, "short", short_lines)
    assert one_longest <= 64 * 1024 + 32  # a piece and its `[worker:0] ` prefix
    assert one_printed >= size and short_printed >= size
    assert one <= short * 1.3, (one, short)  # KiB


def test_a_stop_report_quoting_a_host_takes_no_markup_from_it(monkeypatch) -> None:
    # `why` is what the connection to the host said: rich markup in it is text, not a style or a
    # link, and a stray closing tag is no error
    from tfctl.cli import render
    from tfctl.cluster.answers import StopReport

    monkeypatch.setenv("NO_COLOR", "1")
    screen = Screen()
    monkeypatch.setattr(console, "err", lambda: make_console(screen))
    report = StopReport(hosts=1, unreachable={"h1": "[/red][link=https://evil]x[/link]"})
    render.render_stop(report)
    assert "h1: could not be checked: [/red][link=https://evil]x[/link]" in screen.getvalue()
