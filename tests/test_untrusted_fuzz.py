"""Random bytes a task or a notify command prints, through every place tfctl quotes them, reach
a terminal obeying nothing: no C0 control but tab and newline, nothing in 0x7f-0x9f, no bidi
override (with colour on: SGR colour sequences only).

Seeded, so a failure replays. stdout is a pseudo-terminal (in raw mode: what the program wrote,
byte for byte); stderr (progress, the diagnosis, a start failure, a notify line) is a pipe,
which keeps `up`'s spinner, tfctl's own cursor moves, out of what is checked; the consoles
print the same text to both, the filter does not depend on which.
"""

from __future__ import annotations

import os
import pty
import random
import re
import select
import subprocess
import sys
import time
import tty
from pathlib import Path

import pytest

from tests.conftest import free_ports

SEED = 20261127
PIECES = [
    b"\x1b]0;TITLE\x07",
    b"\x1b]52;c;aGVsbG8=\x1b\\",
    b"\x1b[2J\x1b[H",
    b"\x1b[?25l",
    b"\x1bP1$r\x1b\\",
    b"\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\",
    b"\x9b2J",  # an 8-bit CSI, as a raw byte (invalid UTF-8)
    "\u009b2J\u0085".encode(),  # C1 controls as UTF-8
    "\u202eevil\u202c \u2066x\u2069".encode(),
    b"\x00\x00",
    b"\r\x08\x7f\x0b\x0c",
    b"\xff\xfe\xe2\x80",  # invalid UTF-8
    b"\x1b[31mred\x1b[1;32mgreen",
    b"\t",
    "caf\u00e9 \u2026".encode(),
]
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SGR = re.compile(r"\x1b\[[0-9;]*m")


def hostile_lines(rng: random.Random, count: int) -> bytes:
    lines = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(1, 10)):
            roll = rng.random()
            if roll < 0.5:
                parts.append(rng.choice(PIECES))
            elif roll < 0.8:
                parts.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16))).replace(b"\n", b""))
            else:
                parts.append(b"word ")
        lines.append(b"".join(parts))
    lines.append(b"y" * 200_000 + rng.choice(PIECES))  # one huge line
    lines.append(b"RuntimeError: " + b"".join(rng.choice(PIECES) for _ in range(6)))  # the diagnosis quotes it
    return b"\n".join(lines) + b"\n"


TASK = """
import socket, sys, time
payload, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode != "early":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.listen(8)
sys.stdout.buffer.write(open(payload, "rb").read())
sys.stdout.flush()
if mode == "early":
    sys.exit(3)
time.sleep(60 if mode == "serve" else 2)
sys.exit(1)
"""


def on_a_terminal(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, bytes, bytes]:
    """Run the CLI with stdout on a raw pseudo-terminal; (exit code, what reached it, stderr)."""
    leader, follower = pty.openpty()
    tty.setraw(follower)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfctl", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(follower)
    assert proc.stderr is not None
    out, err = b"", b""
    deadline = time.monotonic() + timeout
    try:
        streams = [leader, proc.stderr.fileno()]
        while streams and time.monotonic() < deadline:
            for fd in select.select(streams, [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal closed: the process is gone
                    chunk = b""
                if not chunk:
                    streams.remove(fd)
                elif fd == leader:
                    out += chunk
                else:
                    err += chunk
        return proc.wait(timeout=10), out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        os.close(leader)


def assert_inert(shown: bytes, colour: bool, what: str) -> None:
    text = shown.decode("utf-8")  # strictly: no stray byte of a task's reaches the terminal
    if colour:
        text = SGR.sub("", text)
    found = UNSAFE.findall(text)
    assert not found, f"{what}: {sorted(set(found))!r} in {text[:2000]!r}"


@pytest.mark.parametrize("colour", [False, True], ids=["NO_COLOR", "FORCE_COLOR"])
def test_random_bytes_from_tasks_and_commands_reach_no_terminal_as_controls(
    tmp_path: Path, home: Path, colour: bool
) -> None:
    rng = random.Random(SEED + colour)
    payload = tmp_path / "payload.bin"
    payload.write_bytes(hostile_lines(rng, 40))
    notify_out = tmp_path / "notify.bin"
    notify_out.write_bytes(hostile_lines(rng, 3).replace(b"y" * 200_000, b"y" * 1000))
    task = tmp_path / "task.py"
    task.write_text(TASK)
    env = {**os.environ, "TFCTL_HOME": str(home)}
    env.update({"FORCE_COLOR": "1"} if colour else {"NO_COLOR": "1"})
    env.pop("NO_COLOR" if colour else "FORCE_COLOR", None)

    def cluster(name: str, ps_mode: str, worker_mode: str) -> list[str]:
        ps, worker = free_ports(2)
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"name: {name}\nstartup_timeout: 20\n"
            f"notify: ['cat {notify_out}; exit 1']\n"
            "jobs:\n"
            f"  ps:\n    hosts: [localhost:{ps}]\n    command: '{{python}} {task} {payload} {ps} {ps_mode}'\n"
            f"  worker:\n    hosts: [localhost:{worker}]\n"
            f"    command: '{{python}} {task} {payload} {worker} {worker_mode}'\n"
        )
        return ["-f", str(path)]

    seen: dict[str, bytes] = {}
    # a live run: status, top and logs quote its tasks' lines
    live = cluster("live", "serve", "serve")
    assert subprocess.run([sys.executable, "-m", "tfctl", *live, "up", "-d"], env=env, timeout=60).returncode == 0
    try:
        for verb in (["status"], ["top", "--once"], ["logs"], ["report", "-o", "-"]):
            code, out, err = on_a_terminal([*live, *verb], env)
            assert code == 0, err
            seen[" ".join(verb)], seen[" ".join(verb) + " (stderr)"] = out, err
    finally:
        subprocess.run([sys.executable, "-m", "tfctl", *live, "down"], env=env, timeout=60, capture_output=True)
    # an attached up: the stream, the diagnosis of the worker's failure, the notify line
    code, seen["up"], seen["up (stderr)"] = on_a_terminal([*cluster("failing", "serve", "fail"), "up"], env)
    assert code != 0 and b"notify:" in seen["up (stderr)"] and b"RuntimeError" in seen["up (stderr)"]
    # a start that fails: its error quotes the ps's last lines
    code, seen["failed start"], seen["failed start (stderr)"] = on_a_terminal(
        [*cluster("early", "early", "serve"), "up"], env
    )
    # The ps's end is seen by the start's answer or, on a busy machine, only by the wait for it
    # to listen (CI saw that): either way its error quotes the ps's lines.
    said = seen["failed start (stderr)"]
    assert code != 0 and (b"before listening" in said or b"right after it started" in said), said[-2000:]
    assert b"ps:0 exited with code 3" in said, said[-2000:]
    for what, shown in seen.items():
        assert_inert(shown, colour, what)
    assert b"^[" in seen["logs"] and b"<U+202E>" in seen["logs"]  # the bytes were there, shown
