"""Every read of something tfctl does not control is bounded, and the bound is named in the
error a user sees: the controller's socket, cluster files, tails, notify output."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_runs import started, write
from tests.fakes import TaskScript
from tfctl.config.loader import parse_config
from tfctl.controller.live import rpc
from tfctl.controller.live.rpc_messages import StatusAsk, StatusReply
from tfctl.errors import ConfigError, StartupError, TfctlError
from tfctl.supervisor.files import MAX_RECORD, read_json
from tfctl.supervisor.logs import MAX_TAIL_BYTES, output_log, tail
from tfctl.supervisor.protocol import TailRequest


def door_answering(tmp_path: Path, text: str) -> rpc.ControllerDoor:
    return rpc.ControllerDoor(tmp_path / rpc.SOCKET_NAME, {StatusAsk: lambda _ask: StatusReply({"text": text})})


def test_an_answer_longer_than_a_request_may_be_comes_through(tmp_path: Path) -> None:
    # `top` of 24 tasks with a minute of history answers about 200 KiB: above the requests' bound
    big = "x" * (4 * rpc.MAX_REQUEST)
    with door_answering(tmp_path, big) as door:
        line = rpc._exchange(door.path, StatusAsk(), 10)
    assert line is not None and json.loads(line)["ok"]["snapshot"]["text"] == big


def test_an_answer_beyond_its_bound_is_an_error_that_names_it(tmp_path: Path) -> None:
    with door_answering(tmp_path, "x" * (rpc.MAX_ANSWER + 1)) as door:
        with pytest.raises(TfctlError, match="answer is longer than its bound of 16 MiB"):
            rpc._exchange(door.path, StatusAsk(), 30)


def test_a_request_beyond_its_bound_is_answered_with_an_error_that_names_it(tmp_path: Path) -> None:
    with door_answering(tmp_path, "unused") as door, socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(10)
        conn.connect(str(door.path))
        conn.sendall(b"x" * (rpc.MAX_REQUEST + 1))
        answer = json.loads(conn.makefile("rb").readline())
    assert answer == {"error": "the controller's request is longer than its bound of 64 KiB"}


HEAD = "name: x\ncommand: 'true'\njobs: {worker: [localhost:2222]}\n"


def alias_bomb() -> str:
    """Ten anchors, each ten aliases of the one before: 10**10 values once expanded."""
    anchors = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    anchors += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    return HEAD + "\n".join(anchors) + "\n"


def in_a_file(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def hostile_files(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (the -f argument, what the error must say)."""
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    return {
        "alias bomb": (in_a_file(tmp_path, "bomb.yaml", alias_bomb()), "more than 10000 values once YAML aliases"),
        "nested 5000 deep": (
            in_a_file(tmp_path, "deep.yaml", HEAD + "x: " + "[" * 5000 + "]" * 5000 + "\n"),
            "nested more than 64 deep",
        ),
        "mappings nested 5000 deep": (
            in_a_file(tmp_path, "deep_maps.yaml", HEAD + "x: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"),
            "nested more than 64 deep",
        ),
        "a million small values": (
            in_a_file(tmp_path, "flat.yaml", HEAD + "x: [" + "1," * 500_000 + "1]\n"),
            "more than 10000 values once YAML aliases",
        ),
        "/dev/zero": ("/dev/zero", "zero: is larger than 1 MiB, the most a cluster file may be"),
        "a 60 MB file": (
            in_a_file(tmp_path, "big.yaml", HEAD + "# " + "x" * 60_000_000 + "\n"),
            "big.yaml: is larger than 1 MiB",
        ),
        "a workdir in a symlink loop": (
            in_a_file(tmp_path, "loop.yaml", HEAD + "workdir: loop1\n"),
            "loop1 cannot be followed: Symlink loop",
        ),
        "a 200 KB env value": (
            in_a_file(tmp_path, "env.yaml", HEAD + "env: {BIG: '" + "x" * 200_000 + "'}\n"),
            "env.BIG: `BIG=...` is 200004 bytes, over the 128 KiB",
        ),
    }


LIMITED = """
import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # the old parser grew to GBs
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=20)
print(done.returncode)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stdout.write(done.stderr)
"""


@pytest.mark.parametrize(
    "case",
    [
        "alias bomb",
        "nested 5000 deep",
        "mappings nested 5000 deep",
        "a million small values",
        "/dev/zero",
        "a 60 MB file",
        "a workdir in a symlink loop",
        "a 200 KB env value",
    ],
)
def test_a_hostile_cluster_file_is_refused_quickly_naming_its_bound(tmp_path: Path, case: str) -> None:
    argument, said = hostile_files(tmp_path)[case]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, sys.executable, "-m", "tfctl", "-f", argument, "up", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    code, peak_kib, stderr = done.stdout.split("\n", 2)
    assert code == "2" and said in stderr and "Traceback" not in stderr, done.stdout + done.stderr
    assert int(peak_kib) < 100 * 1024 and time.monotonic() - started < 10


def test_the_bounds_leave_a_big_honest_file_alone() -> None:
    hosts = ", ".join(f"h{i}:2222" for i in range(2000))
    assert len(parse_config(f"name: x\ncommand: 'true'\njobs: {{worker: [{hosts}]}}\n", Path("c.yaml")).tasks()) == 2000
    with pytest.raises(ConfigError) as nested_60_deep:
        parse_config(HEAD + "x: " + "[" * 60 + "]" * 60 + "\n", Path("c.yaml"))
    assert [p.message for p in nested_60_deep.value.problems] == ["unknown key `x`"]


def test_a_tail_after_a_5_MB_line_sees_what_came_after_it(tmp_path: Path) -> None:
    log = Path(output_log(str(tmp_path), "r-1", "worker:0"))
    log.parent.mkdir(parents=True)
    after = ["step 2", "step 3", "Traceback (most recent call last):", "RuntimeError: the real cause"]
    log.write_bytes(b"step 1\n" + b"x" * 5_000_000 + b"\n" + "\n".join(after).encode() + b"\n")
    lines = tail(str(tmp_path), TailRequest("r-1", ["worker:0"], 200)).tails["worker:0"]
    assert lines[-4:] == after and len(lines) == 5  # the huge line's last part, then all after it
    assert len(lines[0]) == MAX_TAIL_BYTES - sum(len(line) + 1 for line in after) - 1


def test_a_failed_start_quotes_at_most_500_characters_of_each_line(tmp_path: Path, fake_backend) -> None:
    fake_backend.scripts["ps:0"] = TaskScript(listen_after=None, end_after=2, exit_code=3, lines=["x" * 100_000, "bye"])
    with pytest.raises(StartupError) as failed:
        started(write(tmp_path))
    said = failed.value.message
    assert "x" * 500 + "… (99500 more characters)\n  bye" in said and len(said) < 2000, said[:300]


MANGLING = ["&a ", "*a", "<<: *a", "[", "]", "{", "}", ": ", "- ", "!!python/object:os.system", "\t", "\x00"]
MANGLING += ["\u202e", "'", '"', "{job_name}", "{0}", "{x!r}", "..", "$(id)", "\n", "  ", "~", "1e400", "? ", "---\n"]
MANGLING += ["%YAML 1.1\n", "&b [*b]", "\ufeff", "\r", "[" * 100, "{a: " * 70]


def test_a_mangled_cluster_file_is_a_config_error_and_never_another_exception() -> None:
    example = (Path(__file__).resolve().parents[1] / "cluster.yaml.example").read_text()
    rng = random.Random(1)
    for _ in range(500):
        text = example
        for _ in range(rng.randrange(1, 6)):
            at = rng.randrange(len(text) + 1)
            if rng.random() < 0.6:
                text = text[:at] + rng.choice(MANGLING) + text[at:]
            else:
                text = text[:at] + text[at + rng.randrange(1, 20) :]
        try:
            parse_config(text, Path("c.yaml"))
        except ConfigError:
            pass


def test_a_state_file_on_a_host_is_read_to_its_bound_and_no_further(tmp_path: Path) -> None:
    record = tmp_path / "exit.json"
    record.write_text('{"exit_code": 0, "pad": "' + "x" * (MAX_RECORD + 10) + '"}')
    assert read_json(str(record)) is None  # not one tfctl wrote: as if unreadable
    record.write_text('{"exit_code": 3}')
    assert read_json(str(record)) == {"exit_code": 3}
