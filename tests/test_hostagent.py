"""HostAgent and the shipped supervisor: replays never run a request twice, shipping, failures, the zipapp."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import queue
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, free_ports, marked_processes
from tfctl.cluster.agent import HostAgent
from tfctl.errors import HostError
from tfctl.supervisor import bundle
from tfctl.supervisor.files import state_root
from tfctl.supervisor.procfs import live_pids
from tfctl.supervisor.protocol import (
    InfoRequest,
    StartAnswer,
    StartRequest,
    StatusRequest,
    StopRequest,
    TaskLaunch,
    TaskState,
    envelope,
)
from tfctl.supervisor.stream import FollowRequest
from tfctl.supervisor.tasks import MONITOR_NAME
from tfctl.transport.base import Result, Stream, Transport, Tunnel
from tfctl.transport.local import LocalTransport

PY = sys.executable
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "host"


def monitors_of(task_dir: Path) -> list[int]:
    """Monitors (by their name) holding the task's log open: forked, their cmdline is the supervisor's."""
    log = str(task_dir / "output.log")
    found = []
    for pid in live_pids():
        try:
            if Path(f"/proc/{pid}/comm").read_bytes().strip() != MONITOR_NAME:
                continue
            fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        if log in fds:
            found.append(pid)
    return found


def processes_of(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


# ---------------------------------------------------------------- replays


class _DroppedStream(Stream):
    """The controller's end of a link that drops right after one request went out. The host's
    process goes on, as a command over SSH does when its client vanishes: it reads the request,
    runs it, and fails to write the answer."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        self._gone = threading.Event()

    def lines(self) -> Iterator[str]:
        self._gone.wait()
        return iter(())

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(data)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._gone.set()

    def close(self) -> None:
        self._gone.set()


class DroppingTransport(LocalTransport):
    """Local commands; once armed, the next conversation drops after its first request."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.dropped: list[subprocess.Popen] = []

    def stream(self, command: str, *, stdin: bytes | None = None) -> Stream:
        if not self.armed or stdin is not None:
            return super().stream(command, stdin=stdin)
        self.armed = False
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )
        self.dropped.append(proc)
        return _DroppedStream(proc)


def test_a_start_whose_answer_was_lost_runs_once_and_its_replay_gets_the_first_answer(root: Path) -> None:
    transport = DroppingTransport()
    with HostAgent(transport, None, str(root)) as agent:
        agent.call(InfoRequest())  # first contact: ships the supervisor
        agent.close()  # the next request opens a new conversation, which will drop
        transport.armed = True
        answer = agent.call(StartRequest("lost", [TaskLaunch("worker:0", f"{PY} {FAKE_TASK} --sleep -1", grace=1)]))
        try:
            assert len(transport.dropped) == 1
            first = transport.dropped[0]
            assert first.wait(timeout=30) == 0  # the first execution ran to its end, answering nobody
            records = list((host_state(root) / "requests").glob("*.json"))
            assert len(records) == 1
            assert StartAnswer.from_wire(json.loads(records[0].read_text())["ok"]) == answer
            assert answer.tasks["worker:0"].state is TaskState.RUNNING
            task_dir = host_state(root) / "tasks" / "lost" / "worker-0"
            assert [p.name for p in (host_state(root) / "tasks" / "lost").iterdir()] == ["worker-0"]
            assert (task_dir / "spec.json").is_file()
            assert len(monitors_of(task_dir)) == 1
            assert processes_of("lost") == [answer.tasks["worker:0"].pid]
        finally:
            agent.call(StopRequest("lost", 1))


def test_a_forked_monitor_holds_nothing_of_the_supervisors_conversation(root: Path) -> None:
    """Holding the channel's stdin or stdout would keep every ssh session of `up` open for the run's life."""
    with HostAgent(LocalTransport(), None, str(root)) as agent:
        agent.call(StartRequest("fds", [TaskLaunch("worker:0", f"{PY} {FAKE_TASK} --sleep -1", grace=1)]))
        try:
            task_dir = host_state(root) / "tasks" / "fds" / "worker-0"
            [pid] = monitors_of(task_dir)
            held = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
            assert held <= {
                os.devnull,
                str(task_dir / "monitor.log"),
                str(task_dir / "output.log"),
                "anon_inode:[pidfd]",
            }
            assert Path(f"/proc/{pid}/cwd").resolve() == Path("/")
        finally:
            agent.call(StopRequest("fds", 1))


def serve_pyz(root: Path) -> list[str]:
    """The command line of `serve` from the zipapp, written under root as HostAgent would."""
    digest, data = bundle.artifact()
    pyz = root / f"supervisor-{digest}.pyz"
    LocalTransport().put(data, str(pyz), 0o600)
    return [PY, "-I", "-S", str(pyz), "serve"]


def test_replays_racing_on_two_conversations_start_the_task_once(root: Path) -> None:
    command = serve_pyz(root)
    request = StartRequest(
        "race", [TaskLaunch(f"worker:{i}", f"{PY} {FAKE_TASK} --sleep -1", grace=1) for i in range(3)]
    )
    line = (json.dumps(envelope("race-1", str(root), request).to_wire()) + "\n").encode()
    conversations = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        for _ in range(2)
    ]
    try:
        answers = [json.loads(proc.communicate(line, timeout=30)[0]) for proc in conversations]
        assert answers[0] == answers[1] and "ok" in answers[0] and answers[0]["id"] == "race-1"
        pids = sorted(info["pid"] for info in answers[0]["ok"]["tasks"].values())
        assert sorted(processes_of("race")) == pids and len(pids) == 3
    finally:
        with HostAgent(LocalTransport(), None, str(root)) as agent:
            agent.call(StopRequest("race", 1))


def test_a_replay_waits_for_the_running_first_execution_and_answers_with_its_result(root: Path) -> None:
    command = serve_pyz(root)
    journal = host_state(root) / "requests"
    journal.mkdir(parents=True)
    request = StartRequest("waits", [TaskLaunch("worker:0", "true")])
    line = (json.dumps(envelope("first-1", str(root), request).to_wire()) + "\n").encode()
    with open(journal / "first-1.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first execution is still running
        replay = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert replay.stdin is not None
            replay.stdin.write(line)
            replay.stdin.close()
            time.sleep(0.5)  # deliberately: a replay that did not wait would answer and exit by then
            assert replay.poll() is None  # waiting for the first execution
            recorded = {"id": "first-1", "ok": {"tasks": {}}}
            (journal / "first-1.json").write_text(json.dumps(recorded))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    assert replay.wait(timeout=30) == 0 and replay.stdout is not None
    assert json.loads(replay.stdout.read()) == recorded
    assert not (host_state(root) / "tasks").exists()  # the replay itself started nothing


def test_a_supervisor_ended_during_a_start_finishes_and_records_it_first(root: Path) -> None:
    """Closing a local stream sends SIGTERM; a `start` under way still runs whole and is recorded."""
    serve_pyz(root)
    request = StartRequest("ended", [TaskLaunch("worker:0", f"{PY} {FAKE_TASK} --sleep -1", grace=1)])
    line = (json.dumps(envelope("ended-1", str(root), request).to_wire()) + "\n").encode()
    transport = LocalTransport()
    stream = transport.stream(HostAgent(transport, None, str(root))._serve_command())
    try:
        stream.send(line)
        wait_until(lambda: (host_state(root) / "requests" / "ended-1.lock").exists(), 10, "the start under way")
    finally:
        stream.close()  # SIGTERM, while the start runs
    try:
        wait_until(lambda: (host_state(root) / "requests" / "ended-1.json").exists(), 10, "the start recorded")
        record = json.loads((host_state(root) / "requests" / "ended-1.json").read_text())
        assert record["ok"]["tasks"]["worker:0"]["state"] == "running"
        assert processes_of("ended") == [record["ok"]["tasks"]["worker:0"]["pid"]]
    finally:
        with HostAgent(LocalTransport(), None, str(root)) as agent:
            agent.call(StopRequest("ended", 1))


def test_old_journal_entries_are_pruned(root: Path) -> None:
    journal = host_state(root) / "requests"
    journal.mkdir(parents=True)
    old, recent = journal / "old.json", journal / "recent.json"
    for path in (old, recent, journal / "old.lock"):
        path.write_text("{}")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    os.utime(journal / "old.lock", (two_days_ago, two_days_ago))
    with HostAgent(LocalTransport(), None, str(root)) as agent:
        agent.call(StartRequest("prune", [TaskLaunch("worker:0", "true")]))
    assert not old.exists() and not (journal / "old.lock").exists() and recent.exists()


# ---------------------------------------------------------------- shipping


class CountingTransport(LocalTransport):
    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        self.puts.append(path)
        super().put(data, path, mode)


def changed_artifact() -> tuple[str, bytes]:
    files = bundle.runtime_files()
    files["tfctl_supervisor/errors.py"] += b"\n# a newer tfctl\n"
    data = bundle.zipapp(files)
    return bundle.digest(data), data


def test_the_supervisor_is_shipped_on_first_contact_and_after_it_changes(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace_file = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TFCTL_TRACE", str(trace_file))
    transport = CountingTransport()
    digest, data = bundle.artifact()
    with HostAgent(transport, None, str(root)) as agent:
        agent.call(InfoRequest())
        agent.call(InfoRequest())
    assert transport.puts == [f"{root}/supervisor-{digest}.pyz"]
    assert (root / f"supervisor-{digest}.pyz").read_bytes() == data
    with HostAgent(transport, None, str(root)) as agent:  # another command: the host has it
        agent.call(InfoRequest())
    assert len(transport.puts) == 1

    new_digest, new_data = changed_artifact()
    monkeypatch.setattr(bundle, "artifact", lambda: (new_digest, new_data))
    with HostAgent(transport, None, str(root)) as agent:
        assert agent.call(InfoRequest()).agent_python
    assert transport.puts[1:] == [f"{root}/supervisor-{new_digest}.pyz"]
    events = [json.loads(line)["event"] for line in trace_file.read_text().splitlines()]
    assert events.count("agent.ship") == 2 and events.count("agent.info") == 4


def test_follow_ships_the_supervisor_on_first_contact(root: Path) -> None:
    with HostAgent(LocalTransport(), None, str(root)) as agent:
        stream, events = agent.follow(FollowRequest("nothing", {"worker:0": 0}))
        try:
            assert list(events) == []
        finally:
            stream.close()
    assert (root / f"supervisor-{bundle.artifact()[0]}.pyz").is_file()


# ---------------------------------------------------------------- failures


class _ScriptedStream(Stream):
    def __init__(self, reply: Callable[[dict], dict | None]) -> None:
        self._reply = reply
        self._lines: queue.Queue[str | None] = queue.Queue()

    def lines(self) -> Iterator[str]:
        while (line := self._lines.get()) is not None:
            yield line

    def send(self, data: bytes) -> None:
        answer = self._reply(json.loads(data))
        if answer is not None:
            self._lines.put(json.dumps(answer))

    def close(self) -> None:
        self._lines.put(None)


class ScriptedTransport(Transport):
    """A host whose supervisor answers every envelope with `reply(envelope)` (None: silence)."""

    host = "scripted"

    def __init__(self, reply: Callable[[dict], dict | None]) -> None:
        self.reply = reply

    @property
    def is_local(self) -> bool:
        return False

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> Result:
        raise AssertionError("no retry expected")

    def stream(self, command: str, *, stdin: bytes | None = None) -> Stream:
        return _ScriptedStream(self.reply)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        raise AssertionError("no shipping expected")

    def attach(self, command: str, *, tty: bool) -> int:
        raise AssertionError("no attached command expected")

    def tunnel(self, port: int) -> Tunnel:
        raise AssertionError("no tunnel expected")

    def close(self) -> None:
        pass


def test_an_answer_to_another_request_is_refused() -> None:
    agent = HostAgent(
        ScriptedTransport(lambda env: {"id": "someone-else", "ok": {"hostname": "h", "agent_python": "3"}}), None, "/r"
    )
    with pytest.raises(HostError, match="answered request 'someone-else'"):
        agent.call(InfoRequest())


def test_no_answer_in_time_is_a_host_error() -> None:
    agent = HostAgent(ScriptedTransport(lambda env: None), None, "/r")
    began = time.monotonic()
    with pytest.raises(HostError, match=r"scripted: supervisor `info` gave no answer within 0.2s"):
        agent.call(InfoRequest(), timeout=0.2)
    assert time.monotonic() - began < 5


def test_an_error_answer_is_a_host_error_with_its_message() -> None:
    agent = HostAgent(ScriptedTransport(lambda env: {"id": env["id"], "error": "disk full"}), None, "/r")
    with pytest.raises(HostError, match="^scripted: disk full$"):
        agent.call(InfoRequest())


def test_a_supervisor_that_cannot_start_is_explained(root: Path) -> None:
    with HostAgent(LocalTransport(), "/nonexistent/python", str(root)) as agent:
        with pytest.raises(HostError, match="supervisor `info` failed: .*not found") as caught:
            agent.call(InfoRequest())
    assert "Python >= 3.8" in (caught.value.hint or "")


# ---------------------------------------------------------------- the zipapp


def test_the_zipapp_is_deterministic_and_named_by_its_content() -> None:
    first, second = bundle.zipapp(bundle.runtime_files()), bundle.zipapp(bundle.runtime_files())
    assert first == second
    digest, data = bundle.artifact()
    assert data == first and digest == hashlib.sha256(data).hexdigest()[:16]
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert names == sorted(names) and "__main__.py" in names and "tfctl_supervisor/protocol.py" in names
    assert "tfctl_supervisor/bundle.py" not in names  # controller-only


OTHER_PYTHONS = [SYSTEM_PYTHON, "/root/.pyenv/versions/3.8.18/bin/python"]


@pytest.mark.parametrize("python", OTHER_PYTHONS)
def test_the_zipapp_runs_isolated_on_other_interpreters(root: Path, python: str) -> None:
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is not installed here, or not runnable by this user")
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with HostAgent(LocalTransport(), python, str(root)) as agent:
        assert agent.call(InfoRequest()).agent_python == version
        agent.call(StartRequest("other", [TaskLaunch("worker:0", "echo done", grace=1)]))
        exited = host_state(root) / "tasks" / "other" / "worker-0" / "exit.json"
        wait_until(exited.exists, 10, "the task's exit recorded")
        assert agent.call(StopRequest("other", 1)).tasks["worker:0"].state is TaskState.SUCCEEDED


def test_the_first_run_unpacks_the_zipapp_and_runs_from_the_copy(root: Path) -> None:
    digest, _data = bundle.artifact()
    unpacked = root / f"supervisor-{digest}.d"
    with HostAgent(LocalTransport(), None, str(root)) as agent:
        agent.call(InfoRequest())
        assert (unpacked / "tfctl_supervisor" / "protocol.py").is_file()
        assert (unpacked / "tfctl_supervisor" / "__pycache__").is_dir()  # what the zip could not cache
        assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
        answer = agent.call(StartRequest("unpacked", [TaskLaunch("worker:0", f"{PY} {FAKE_TASK} --sleep -1", grace=1)]))
        proc = json.loads((host_state(root) / "tasks" / "unpacked" / "worker-0" / "proc.json").read_text())
        monitor = f"/proc/{proc['monitor']['pid']}"
        # forked from the supervisor (which runs the copy: its __pycache__ above), not a new interpreter
        assert Path(f"{monitor}/cmdline").read_bytes().split(b"\0")[-2:] == [b"serve", b""]
        assert Path(f"{monitor}/comm").read_bytes().strip() == MONITOR_NAME
        assert answer.tasks["worker:0"].state is TaskState.RUNNING
        assert agent.call(StopRequest("unpacked", 1)).remaining == []


# ---------------------------------------------------------------- TensorFlow in a distro Python's virtualenv


def distro_venv(tmp_path_factory: pytest.TempPathFactory, name: str) -> tuple[Path, Path]:
    """A new virtualenv of the distro Python (skipped where it cannot be made): its python and
    its site-packages."""
    venv = tmp_path_factory.mktemp(name) / "env"
    made = subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot make a virtualenv: {made.stderr.strip()}")
    python = venv / "bin" / "python"
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return python, Path(site_packages)


@pytest.fixture(scope="module")
def venv_with_fake_tf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv of the distro Python holding a `tensorflow 9.9.9` distribution (metadata only)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is not installed")
    python, site_packages = distro_venv(tmp_path_factory, "venv")
    dist_info = site_packages / "tensorflow-9.9.9.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 9.9.9\n")
    return python


@pytest.mark.parametrize("supervisor", ["the venv's python", SYSTEM_PYTHON])
def test_info_finds_tensorflow_in_a_distro_pythons_virtualenv(
    root: Path, venv_with_fake_tf: Path, supervisor: str
) -> None:
    python = str(venv_with_fake_tf)
    with HostAgent(LocalTransport(), python if supervisor == "the venv's python" else supervisor, str(root)) as agent:
        answer = agent.call(InfoRequest(python))
    assert answer.tensorflow == "tensorflow 9.9.9"
    assert answer.python_executable == python
    assert answer.python_error is None


@pytest.fixture(scope="module")
def layered_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with no TensorFlow of its own whose site-packages holds a .pth file naming
    another directory that does (an environment layered on another, as conda-style setups and
    `pip install -e` do): `import tensorflow` works with its python."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is not installed")
    base = tmp_path_factory.mktemp("base")
    dist_info = base / "tensorflow-8.8.8.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 8.8.8\n")
    (base / "tensorflow").mkdir()
    (base / "tensorflow" / "__init__.py").write_text("__version__ = '8.8.8'\n")
    python, site_packages = distro_venv(tmp_path_factory, "layer")
    (site_packages / "layered.pth").write_text(f"# the base environment\n{base}\nimport os\n")
    imported = subprocess.run(
        [str(python), "-c", "import tensorflow; print(tensorflow.__version__)"], capture_output=True
    )
    assert imported.stdout.strip() == b"8.8.8", imported  # as the task will see it
    return python


@pytest.mark.parametrize("supervisor", ["the venv's python", SYSTEM_PYTHON])
def test_info_finds_tensorflow_a_pth_file_brings_in(root: Path, layered_venv: Path, supervisor: str) -> None:
    """The supervisor runs with -S, so no .pth file is read for it; it must still report what the
    task's interpreter would import."""
    python = str(layered_venv)
    with HostAgent(LocalTransport(), python if supervisor == "the venv's python" else supervisor, str(root)) as agent:
        answer = agent.call(InfoRequest(python))
    assert answer.tensorflow == "tensorflow 8.8.8"
    assert answer.python_error is None


def test_a_request_id_that_is_no_plain_word_is_refused_for_the_journal(root: Path) -> None:
    request = StartRequest("bad-id", [TaskLaunch("worker:0", "true")])
    line = (json.dumps(envelope("../escape", str(root), request).to_wire()) + "\n").encode()
    done = subprocess.run(serve_pyz(root), input=line, capture_output=True, timeout=30)
    assert "not a plain word" in json.loads(done.stdout)["error"]
    assert not (host_state(root) / "tasks").exists()


def host_state(root: Path | str) -> Path:
    """Where the supervisor on this machine keeps its own files under `root`."""
    return Path(state_root(str(root)))


def test_status_waits_on_the_host_until_the_port_listens(root: Path) -> None:
    """A start waiting for its ps asks once and hears back as soon as the port listens, rather
    than polling from the controller; a port that never listens costs just the wait asked for."""
    late, never = free_ports(2)
    launches = [
        TaskLaunch("ps:0", f"{PY} {FAKE_TASK} --sleep -1 --port {late} --delay-listen 0.6", grace=1),
        TaskLaunch("ps:1", f"{PY} {FAKE_TASK} --sleep -1", grace=1),
    ]
    with HostAgent(LocalTransport(), None, str(root)) as agent:
        agent.call(StartRequest("waits-here", launches))
        try:
            began = time.monotonic()
            answer = agent.call(StatusRequest("waits-here", {"ps:0": late}, wait_listening=10))
            assert answer.tasks["ps:0"].listening
            assert 0.3 < time.monotonic() - began < 5
            began = time.monotonic()
            answer = agent.call(StatusRequest("waits-here", {"ps:1": never}, wait_listening=0.5))
            assert not answer.tasks["ps:1"].listening
            assert 0.5 <= time.monotonic() - began < 3
        finally:
            agent.call(StopRequest("waits-here", 1))
    assert processes_of("waits-here") == []
