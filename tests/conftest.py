"""Shared fixtures: an isolated TFCTL_HOME per test, free ports, and a leak guard.

The leak guard is the point of this project: after every test, any process carrying a
TFCTL_RUN_ID marker that did not exist before the test is a bug. The guard kills such processes
by PID (never by name) and fails the test.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator

import pytest

from bench.containers_lab import DockerLab, Lab, PodmanLab, build_rootfs, skip_reason
from bench.waiting import WaitTimeout, wait_until
from tfctl.runs.record import HostSpec, RunRecord, TaskSpec
from tfctl.runs.store import RunStore
from tfctl.supervisor.procfs import proc_env_markers, proc_stat
from tfctl.supervisor.protocol import RunState
from tfctl.transport.specs import LocalSpec

REPO = Path(__file__).resolve().parent.parent
FAKE_TASK = REPO / "tests" / "tasks" / "fake_task.py"

# Every process this test session starts inherits this marker, so the leak guard judges only
# our own processes, never those of another test run on the same machine.
SESSION_MARKER = f"TFCTL_TEST_SESSION={os.getpid()}-{time.time_ns()}".encode()
os.environ["TFCTL_TEST_SESSION"] = SESSION_MARKER.decode().split("=", 1)[1]

# A suite started as a background job (`cmd &` in a script) inherits SIGINT ignored, and so would
# every `tfctl` it starts: the Ctrl-C tests send it as a user's terminal would, so it must arrive.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering, which keeps a module's tests together
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with simulated hosts, Slurm, containers or real TensorFlow first, each whole and in
    order: under `pytest -n 2 --dist loadfile` a worker takes a module at a time in this order,
    and a long module started last would leave the other worker idle at the end."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow = {module(item) for item in items if _slow(item)}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(module(item), index)
    items.sort(key=lambda item: (module(item) not in slow, first[module(item)]))


def _slow(item: pytest.Item) -> bool:
    """Runs hosts, Slurm, containers or TensorFlow: a marker says so, or a lab fixture it uses
    (the container image's, `rootfs`, among them)."""
    labs = [name for name in getattr(item, "fixturenames", ()) if name.endswith("lab") or name == "rootfs"]
    return bool(labs) or any(item.get_closest_marker(name) for name in ("netns", "tf"))


def ours(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return SESSION_MARKER in f.read().split(b"\0")
    except OSError:
        return False


def marked_processes() -> dict[int, tuple[int, str]]:
    """pid -> (start time, run id) of every live process of this session carrying TFCTL_RUN_ID."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        run, _task = proc_env_markers(int(name))
        st = proc_stat(int(name))
        if run and st and st["state"] not in ("Z", "X") and ours(int(name)):
            found[int(name)] = (st["starttime"], run)
    return found


def kill_by_pid(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(autouse=True)
def leak_guard(request: pytest.FixtureRequest):
    before = marked_processes()
    yield
    try:  # monitors clean up right after a task ends; give them a moment
        wait_until(
            lambda: {p: v for p, v in marked_processes().items() if before.get(p) != v},
            3,
            "the test's processes to end",
            until=lambda leaked: not leaked,
            interval=0.1,
        )
    except WaitTimeout as late:
        leaked = late.last
        assert isinstance(leaked, dict)
        kill_by_pid(list(leaked))
        pytest.fail(f"test left processes running: {sorted(leaked)} (runs {sorted({v[1] for v in leaked.values()})})")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private TFCTL_HOME; stops any detached watcher the test left behind, and fails for it."""
    path = tmp_path / "tfctl-home"
    monkeypatch.setenv("TFCTL_HOME", str(path))
    yield path
    from tfctl.controller.live.watcher import is_running

    stray = []
    for record in RunStore(path).all():
        w = record.watcher
        if w is not None and w.pid != os.getpid():  # (an attached `tfctl.up` in the test itself has returned)
            try:
                wait_until(
                    functools.partial(is_running, w),
                    10,
                    f"the watcher of {record.run_id} to end",
                    until=lambda alive: not alive,
                    interval=0.1,
                )
            except WaitTimeout:
                kill_by_pid([w.pid])
                stray.append(record.run_id)
    assert not stray, f"detached watcher still running after the test for runs {stray}"


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (the kernel picks them, so tests never collide)."""
    socks, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def port_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tfctl(
    *args: str, home: Path, cwd: Path | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "tfctl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TFCTL_HOME": str(home), **(env or {})},
    )


def spawn_tfctl(
    *args: str,
    home: Path,
    stdout: int = subprocess.PIPE,
    stderr: int = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start the real CLI in a subprocess (an attached `up`, `logs -f`) and leave it running:
    the caller reads its output, signals it, and waits for it."""
    return subprocess.Popen(
        [sys.executable, "-m", "tfctl", *args],
        stdout=stdout,
        stderr=stderr,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home), **(env or {})},
    )


def fake(name_flags: str) -> str:
    """A cluster-file command running the fake task with the given flags."""
    return f"{{python}} {FAKE_TASK} {name_flags}"


def read_rest(proc: subprocess.Popen, timeout: float) -> str:
    """The rest of a text-mode process's stdout, once it exits (killed after `timeout`).

    Not `communicate(timeout=...)`: that reads the pipe's file descriptor itself, so whatever an
    earlier `proc.stdout.readline()` already buffered would be lost."""
    assert proc.stdout is not None
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        out = proc.stdout.read()
        proc.wait()
    finally:
        killer.cancel()
    return out


def wait_for_line(stream: IO[str], text: str, timeout: float) -> str:
    """Read `stream` up to the first line holding `text`, and return that line; fail if the stream
    ends first, or after `timeout` seconds. A read that blocks is not interrupted: the writer must
    go on writing, or exit."""

    def next_line() -> str:
        line = stream.readline()
        assert line, f"the output ended before a line with {text!r}"
        return line

    return wait_until(next_line, timeout, f"a line with {text!r}", until=lambda line: text in line, interval=0)


def add_run(home: Path, run_id: str, cluster_file: Path, created_at: float, jobs: dict[str, int]) -> RunRecord:
    """A finished run in the store at `home`, with no process anywhere: for what reads the store only."""
    tasks = tuple(
        TaskSpec(job, i, "localhost", 2222 + n, "true", {}, None)
        for n, (job, i) in enumerate((job, i) for job, count in jobs.items() for i in range(count))
    )
    record = RunRecord(
        run_id=run_id,
        cluster_name=run_id.split("-")[0],
        cluster_file=str(cluster_file.resolve()),
        created_at=created_at,
        tasks=tasks,
        hosts=(HostSpec("localhost", None, str(home), LocalSpec()),),
        grace_period=1.0,
        state=RunState.SUCCEEDED,
    )
    RunStore(home).create(record)
    return record


def no_warnings(stderr: str) -> None:
    """An attached `up` of a healthy run says nothing but progress: no note, no warning."""
    noise = [
        line for line in stderr.splitlines() if "fix:" in line or "warning" in line.lower() or "never logged" in line
    ]
    assert not noise, "\n".join(noise)


@pytest.fixture
def fake_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The tests' backend (`tests/fake_backend`), registered as any backend is, with a fresh lab
    of in-process hosts and a private TFCTL_HOME; yields the lab."""
    from tests.fake_backend import backend as fake
    from tfctl.registry import backends

    monkeypatch.setitem(backends.PACKAGES, "fake", "tests.fake_backend")
    monkeypatch.setenv("TFCTL_HOME", str(tmp_path / "tfctl-home"))
    return fake.reset()


# ---------------------------------------------------------------- container runtimes of the suite's


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test image's root filesystem, built once a session."""
    reason = skip_reason("podman") and skip_reason("docker")
    if reason is not None:
        pytest.skip(reason)
    tarball = tmp_path_factory.mktemp("rootfs") / "rootfs.tar"
    build_rootfs(tarball)
    return tarball


def _session_lab(
    kind: type[PodmanLab] | type[DockerLab], tmp_path_factory: pytest.TempPathFactory, rootfs: Path
) -> Iterator[Lab]:
    """The runtime's lab (skipped where it cannot run), started with the test image; its settings
    reach every supervisor the tests start through the environment."""
    reason = skip_reason(kind.name)
    if reason is not None:
        pytest.skip(reason)
    lab = kind(tmp_path_factory.mktemp(kind.name))
    try:
        lab.start(rootfs)
        with pytest.MonkeyPatch.context() as environment:
            for key, value in lab.env.items():
                environment.setenv(key, value)
            yield lab
    finally:
        lab.tear_down()


@pytest.fixture(scope="session")
def podman_lab(tmp_path_factory: pytest.TempPathFactory, rootfs: Path) -> Iterator[Lab]:
    yield from _session_lab(PodmanLab, tmp_path_factory, rootfs)


@pytest.fixture(scope="session")
def docker_lab(tmp_path_factory: pytest.TempPathFactory, rootfs: Path) -> Iterator[Lab]:
    yield from _session_lab(DockerLab, tmp_path_factory, rootfs)
