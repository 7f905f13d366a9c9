"""The host supervisor with real processes: start, status, stop, follow, ports, reaping orphans."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, free_ports
from tfctl.cluster.agent import HostAgent
from tfctl.errors import HostError
from tfctl.supervisor.files import state_root
from tfctl.supervisor.monitor import exec_form
from tfctl.supervisor.procfs import proc_env_markers, proc_stat
from tfctl.supervisor.protocol import (
    PortsRequest,
    ReapRequest,
    StartRequest,
    StatusRequest,
    StopRequest,
    TaskInfo,
    TaskLaunch,
    TaskState,
)
from tfctl.supervisor.stream import FollowEvent, FollowRequest, LogChunk, TaskEnded
from tfctl.transport.local import LocalTransport

PY = sys.executable


def pycmd(source: str) -> str:
    """A task command running Python source, quoted for the shell as the orchestrator would."""
    return f"{PY} -c {shlex.quote(source)}"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[HostAgent]:
    with HostAgent(LocalTransport(), None, str(tmp_path / "host")) as agent:
        yield agent


def start(agent: HostAgent, run: str, task: str, command: str, grace: float = 1.0) -> TaskInfo:
    answer = agent.call(StartRequest(run, [TaskLaunch(task, command, grace=grace)]))
    return answer.tasks[task]


def status(agent: HostAgent, run: str, tasks: dict[str, int]) -> dict[str, TaskInfo]:
    return agent.call(StatusRequest(run, tasks)).tasks


def wait_state(agent: HostAgent, run: str, task: str, states: tuple[TaskState, ...], timeout: float = 15) -> TaskInfo:
    return wait_until(
        lambda: status(agent, run, {task: 0})[task],
        timeout,
        f"{task} reaching {[s.value for s in states]}",
        until=lambda info: info.state in states,
    )


def ignores(pid: int, sig: int) -> bool:
    """The process ignores `sig` (the SigIgn mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st["state"] not in ("Z", "X")


def test_task_runs_detached_with_marker_and_log(agent: HostAgent) -> None:
    info = start(
        agent,
        "r1",
        "worker:0",
        pycmd(
            "import os; print(os.getsid(0), os.getpgid(0)); print(os.environ['TFCTL_RUN_ID'], os.environ['TFCTL_TASK'])"
        ),
    )
    assert info.state in (TaskState.RUNNING, TaskState.SUCCEEDED)
    done = wait_state(agent, "r1", "worker:0", (TaskState.SUCCEEDED,))
    assert done.exit_code == 0
    log = Path(host_state(agent.root), "tasks", "r1", "worker-0", "output.log").read_text().split()
    # Its own session and process group, led by the task itself (exec'd: the pid is python's).
    assert log[0] == log[1] == str(info.pid)
    assert log[2:] == ["r1", "worker:0"]
    assert os.getsid(0) != info.pid


def test_every_task_gets_the_run_s_own_directory(agent: HostAgent) -> None:
    start(agent, "r1d", "worker:0", pycmd("import os; print(os.environ['TFCTL_RUN_DIR'])"))
    start(agent, "r1d", "worker:1", "echo $TFCTL_RUN_DIR")
    wait_state(agent, "r1d", "worker:0", (TaskState.SUCCEEDED,))
    wait_state(agent, "r1d", "worker:1", (TaskState.SUCCEEDED,))
    expected = os.path.join(agent.root, "work", "r1d")
    assert os.path.isdir(expected) and os.stat(expected).st_mode & 0o777 == 0o700
    for task in ("worker:0", "worker:1"):
        assert status(agent, "r1d", {task: 0})[task].last_line == expected


def test_nonzero_exit_is_failed_with_code(agent: HostAgent) -> None:
    start(agent, "r2", "worker:1", pycmd("import sys; print('boom'); sys.exit(3)"))
    info = wait_state(agent, "r2", "worker:1", (TaskState.FAILED,))
    assert info.exit_code == 3 and info.signal is None
    assert status(agent, "r2", {"worker:1": 0})["worker:1"].last_line == "boom"


def test_command_that_cannot_start_is_failed(agent: HostAgent) -> None:
    start(agent, "r3", "ps:0", "/nonexistent/program --flag")
    info = wait_state(agent, "r3", "ps:0", (TaskState.FAILED,))
    assert info.exit_code == 127


def test_stop_escalates_to_sigkill_for_a_task_ignoring_sigterm(agent: HostAgent) -> None:
    info = start(agent, "r4", "worker:0", f"{PY} {FAKE_TASK} --ignore-term --sleep -1")
    wait_state(agent, "r4", "worker:0", (TaskState.RUNNING,))
    pid = info.pid
    assert pid is not None
    wait_until(lambda: ignores(pid, signal.SIGTERM), 10, "the task ignoring SIGTERM")
    began = time.monotonic()
    report = agent.call(StopRequest("r4", 0.5))
    assert time.monotonic() - began >= 0.5  # it waited the grace period before SIGKILL
    assert report.killed >= 1 and report.remaining == []
    assert info.pid is not None and not alive(info.pid)
    final = report.tasks["worker:0"]
    assert final.state is TaskState.STOPPED and final.signal == signal.SIGKILL


def test_stop_sends_each_process_of_the_task_one_sigterm(agent: HostAgent, tmp_path: Path) -> None:
    """A handler that saves on SIGTERM runs once: each process of a task whose command keeps its
    shell (several lines) gets one SIGTERM, though the shell ends at once and its monitor then
    cleans up what is left while the stop gives them their grace."""
    counted = tmp_path / "sigterms"
    source = f"""
import os, signal, sys, time
def counted(*_):
    with open({str(counted)!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(0.3)  # (a save: a second SIGTERM now would run this again)
    sys.exit(143)
signal.signal(signal.SIGTERM, counted)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, counted)
print("ready", flush=True)
while True:
    time.sleep(1)
"""
    info = start(agent, "r12", "worker:0", pycmd(source), grace=5.0)
    log = Path(host_state(agent.root), "tasks", "r12", "worker-0", "output.log")
    wait_until(lambda: "ready" in log.read_text(), 10, "the task and its child")
    report = agent.call(StopRequest("r12", 5.0))
    assert report.killed == 0 and report.remaining == []
    pids = counted.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2, pids  # each of the two Pythons once
    assert str(info.pid) not in pids  # (the task's pid is its shell's)


def test_stop_kills_children_in_group_and_escaped_session(agent: HostAgent) -> None:
    start(agent, "r5", "worker:0", f"{PY} {FAKE_TASK} --fork 2 --setsid-child --sleep -1")
    wait_state(agent, "r5", "worker:0", (TaskState.RUNNING,))
    from tests.conftest import marked_processes

    def mine_and_groups() -> tuple[list[int], set[int]]:
        mine = [p for p, (_, run) in marked_processes().items() if run == "r5"]
        return mine, {stat["pgid"] for stat in map(proc_stat, mine) if stat}

    mine: list[int] = []
    try:
        # The escaped child carries the marker from its fork on, and calls setsid() a moment
        # later (before its exec): wait for both. The task, two children in its group, one in
        # its own session.
        mine, _groups = wait_until(
            mine_and_groups,
            10,
            "4 processes in 2 process groups",
            until=lambda found: len(found[0]) == 4 and len(found[1]) == 2,
        )
    finally:
        report = agent.call(StopRequest("r5", 2))
    assert report.processes == 4 and report.remaining == []
    assert not any(alive(p) for p in mine)


def test_children_left_behind_by_a_finished_task_are_cleaned_up(agent: HostAgent) -> None:
    # `bash -c 'a; b'`-style: the leader exits, a child it started is still running.
    start(agent, "r6", "worker:0", f"{PY} {FAKE_TASK} --fork 1 --sleep 0.5", grace=0.5)
    info = wait_state(agent, "r6", "worker:0", (TaskState.SUCCEEDED,))
    assert info.exit_code == 0
    from tests.conftest import marked_processes

    wait_until(lambda: not any(run == "r6" for _, run in marked_processes().values()), 5, "the left child stopped")


def test_reused_pid_is_never_taken_for_the_task(agent: HostAgent, tmp_path: Path) -> None:
    """A record whose pid now belongs to another process reads 'lost', and stop leaves it alone."""
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        d = Path(host_state(agent.root), "tasks", "r7", "ps-0")
        d.mkdir(parents=True)
        (d / "spec.json").write_text(json.dumps({"task": "ps:0", "command": "true"}))
        real = proc_stat(bystander.pid)
        assert real is not None
        (d / "proc.json").write_text(
            json.dumps(
                {
                    "pid": bystander.pid,
                    "pgid": bystander.pid,
                    "starttime": real["starttime"] - 1,
                    "started_at": time.time(),
                    "monitor": {"pid": bystander.pid, "starttime": real["starttime"] - 1},
                }
            )
        )
        assert status(agent, "r7", {"ps:0": 0})["ps:0"].state is TaskState.LOST
        report = agent.call(StopRequest("r7", 0.2))
        assert report.processes == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_starting_a_task_twice_is_refused(agent: HostAgent) -> None:
    start(agent, "r8", "worker:0", "true")
    with pytest.raises(HostError, match="already started"):
        start(agent, "r8", "worker:0", "true")


def test_status_reports_listening_only_for_the_tasks_own_socket(agent: HostAgent) -> None:
    port, other = free_ports(2)
    start(agent, "r9", "ps:0", f"{PY} {FAKE_TASK} --port {port} --sleep -1")
    start(agent, "r9", "worker:0", f"{PY} {FAKE_TASK} --sleep -1")
    st = wait_until(
        lambda: status(agent, "r9", {"ps:0": port, "worker:0": port}),
        10,
        "the ps listening",
        until=lambda st: st["ps:0"].listening,
    )
    assert st["ps:0"].listening is True
    assert st["worker:0"].listening is False  # something listens on that port, but not this task
    ports = agent.call(PortsRequest([port, other])).ports
    assert ports[str(port)].listening and ports[str(port)].pids == [st["ps:0"].pid]
    assert not ports[str(other)].listening
    agent.call(StopRequest("r9", 1))


def follow(agent: HostAgent, run: str, tasks: dict[str, int], **options: Any) -> list[FollowEvent]:
    stream, events = agent.follow(FollowRequest(run, tasks, **options))
    try:
        return list(events)
    finally:
        stream.close()


def text_of(events: list[FollowEvent]) -> str:
    return b"".join(e.data for e in events if isinstance(e, LogChunk)).decode()


def test_follow_loses_and_repeats_nothing_at_volume(agent: HostAgent) -> None:
    count = 200_000
    start(agent, "r10", "worker:0", pycmd(f"import sys\nfor i in range({count}): sys.stdout.write('line %d\\n' % i)"))
    events = follow(agent, "r10", {"worker:0": 0}, follow=True)
    text = text_of(events)
    lines = text.splitlines()
    assert lines == [f"line {i}" for i in range(count)]
    assert events[-1] == TaskEnded("worker:0", len(text.encode()), TaskState.SUCCEEDED)
    # Resuming from any recorded offset gives exactly the rest.
    middle = events[len(events) // 2]
    assert isinstance(middle, LogChunk)
    rest = follow(agent, "r10", {"worker:0": middle.offset})
    assert text[middle.offset :] == text_of(rest)


def test_follow_holds_partial_lines_until_complete(agent: HostAgent) -> None:
    start(
        agent,
        "r11",
        "worker:0",
        pycmd(
            "import sys, time; sys.stdout.write('abc'); sys.stdout.flush(); "
            "time.sleep(3); print('def', flush=True); time.sleep(1); "
            "sys.stdout.write('tail-no-newline')"
        ),
    )
    log = Path(host_state(agent.root), "tasks", "r11", "worker-0", "output.log")
    # the follow below starts while the line is unfinished
    wait_until(lambda: log.exists() and log.read_bytes() == b"abc", 10, "the unfinished line on disk", interval=0.02)
    chunks = [e.data for e in follow(agent, "r11", {"worker:0": 0}, follow=True) if isinstance(e, LogChunk)]
    assert chunks[0] == b"abcdef\n"
    assert b"".join(chunks) == b"abcdef\ntail-no-newline"


def test_tail_returns_last_lines(agent: HostAgent) -> None:
    start(agent, "r12", "worker:0", pycmd("for i in range(100): print(i)"))
    wait_state(agent, "r12", "worker:0", (TaskState.SUCCEEDED,))
    text = text_of(follow(agent, "r12", {"worker:0": 0}, tail=3))
    assert text == "97\n98\n99\n"


def test_reap_stops_orphans_of_its_own_store_only(agent: HostAgent) -> None:
    sleeper = [PY, "-c", "import time; time.sleep(60)"]

    def marked(run: str, store: str) -> subprocess.Popen:
        return subprocess.Popen(
            sleeper, env={**os.environ, "TFCTL_RUN_ID": run, "TFCTL_STORE": store}, start_new_session=True
        )

    orphan, live, foreign = marked("gone-run", "mine"), marked("live-run", "mine"), marked("their-run", "theirs")
    try:
        sleepers = (orphan, live, foreign)
        wait_until(lambda: all(proc_env_markers(p.pid)[0] for p in sleepers), 5, "the sleepers carrying their markers")
        report = agent.call(ReapRequest(["live-run"], 1, "mine"))
        orphan.wait(timeout=5)
        assert report.runs == ["gone-run"]
        assert live.poll() is None  # a live run of this store
        assert foreign.poll() is None  # another user's or home's run: never ours to judge
    finally:
        for p in (orphan, live, foreign):
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    "command, execs",
    [
        ("python train.py --job_name=ps", True),
        ("python x > out.log 2>&1", True),
        ("a; b", False),
        ("a && b", False),
        ("a | b", False),
        ("FOO=1 python x", False),
        ("cd dir && python x", False),
        ("(python x)", False),
        ('echo "a;b"', True),
    ],
)
def test_exec_form_only_for_simple_commands(command: str, execs: bool) -> None:
    assert exec_form(command) == (f"exec {command}" if execs else command)


def host_state(root: Path | str) -> Path:
    """Where the supervisor on this machine keeps its own files under `root`."""
    return Path(state_root(str(root)))


def test_a_stopped_task_starts_again_afresh_only_when_asked_its_old_directory_set_aside(agent, tmp_path):
    """A move restarts a task under its name on the same host (`StartRequest.again`); a plain
    second start is still refused, and a stop of the whole run leaves the set-aside copy alone."""
    start(agent, "r1", "ps:0", pycmd("import time; print('first', flush=True); time.sleep(60)"))
    first = lambda: status(agent, "r1", {"ps:0": 0})["ps:0"].last_line  # noqa: E731
    wait_until(first, 15, "the first start's line", until=lambda line: line == "first")  # then it is stopped
    agent.call(StopRequest("r1", 1.0, tasks=["ps:0"]))
    wait_state(agent, "r1", "ps:0", (TaskState.STOPPED,))
    with pytest.raises(HostError, match="already started"):
        start(agent, "r1", "ps:0", pycmd("print('x')"))
    launch = TaskLaunch("ps:0", pycmd("print('second', flush=True)"), grace=1.0)
    agent.call(StartRequest("r1", [launch], again="moved1"))
    assert wait_state(agent, "r1", "ps:0", (TaskState.SUCCEEDED,)).exit_code == 0
    run_dir = next(p for p in (tmp_path / "host").rglob("ps-0") if p.is_dir() and p.parent.name != "moved1").parent
    assert (run_dir / "ps-0").is_dir() and (run_dir / "moved1" / "ps-0" / "output.log").read_text() == "first\n"
    assert agent.call(StopRequest("r1", 1.0)).processes == 0
