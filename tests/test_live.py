"""The live controller's door: `status` and `down` from another terminal use the connections of
the run's controller (detached watcher or attached `up`) instead of connecting to every host."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, free_ports, marked_processes, port_listening, spawn_tfctl, tfctl
from tests.fakes import record_of
from tfctl.backends.slurm.transport import RELAY
from tfctl.controller.live import rpc as live
from tfctl.controller.live.rpc_messages import (
    DownAsk,
    DownReply,
    LogNote,
    LogsAsk,
    LogsPart,
    StatusAsk,
    StatusReply,
)
from tfctl.controller.live.watcher import controller_of_this_process, is_running
from tfctl.errors import TfctlError, UsageError
from tfctl.runs.record import ControllerKind
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState


def this_process_controls(tmp_path: Path, **changes: Any) -> Any:
    record = record_of({"ps:0": "h0", "worker:0": "h1"})
    return record.replace(watcher=controller_of_this_process(ControllerKind.WATCHER).replace(**changes))


def test_a_door_answers_its_verbs_and_reports_errors_with_their_hint(tmp_path: Path) -> None:
    asked = []

    def status(request: StatusAsk) -> StatusReply:
        asked.append(request)
        return StatusReply({"samples": request.usage_history})

    def down(_request: DownAsk) -> DownReply:
        raise UsageError("cannot stop", hint="try later")

    record = this_process_controls(tmp_path)
    with live.ControllerDoor(live.socket_path(tmp_path), {StatusAsk: status, DownAsk: down}):
        assert stat.S_IMODE(os.stat(live.socket_path(tmp_path)).st_mode) == 0o600
        answer = live.ask(tmp_path, record, StatusAsk(usage_history=60), 5)
        assert type(answer) is StatusReply and answer == StatusReply({"samples": 60})
        assert asked == [StatusAsk(usage_history=60)] and type(asked[0]) is StatusAsk  # typed on arrival
        with pytest.raises(TfctlError) as e:
            live.ask(tmp_path, record, DownAsk(), 5)
        assert (e.value.message, e.value.hint) == ("cannot stop", "try later")
        with pytest.raises(TfctlError, match="does not serve `logs`"):
            live.stream(tmp_path, record, LogsAsk(["ps:0"]))
    assert not live.socket_path(tmp_path).exists()  # closing removes it
    assert live.ask(tmp_path, record, StatusAsk(), 5) is None


def test_a_streamed_answer_comes_in_typed_parts(tmp_path: Path) -> None:
    def logs(request: LogsAsk, _asker_there: Any) -> Iterator[LogsPart]:
        yield LogsPart(text=f"{','.join(request.tasks)} tail {request.tail}\n")
        yield LogsPart(notes=[LogNote("worker:0", "waits for ps:0", "start ps:0")])
        yield LogsPart(errors=["h1: unreachable"])

    record = this_process_controls(tmp_path)
    with live.ControllerDoor(live.socket_path(tmp_path), {}, {LogsAsk: logs}):
        parts = live.stream(tmp_path, record, LogsAsk(["ps:0", "worker:0"], tail=3))
        assert parts is not None
        assert list(parts) == [
            LogsPart(text="ps:0,worker:0 tail 3\n"),
            LogsPart(notes=[LogNote("worker:0", "waits for ps:0", "start ps:0")]),
            LogsPart(errors=["h1: unreachable"]),
        ]


def test_a_down_answer_carries_the_stop_report_and_what_the_backend_released(tmp_path: Path) -> None:
    from tfctl.backends.base import BackendReport
    from tfctl.cluster.answers import StopReport

    report = StopReport(5, {"h1": [42]}, {"h1:2222": [42]}, 2, [2222, 2223], {"h2": "timed out"})
    released = BackendReport("slurm job 7", "CANCELLED", True, {"job_id": "7", "state": "CANCELLED"})
    record = this_process_controls(tmp_path)
    with live.ControllerDoor(live.socket_path(tmp_path), {DownAsk: lambda request: DownReply(report, released)}):
        answer = live.ask(tmp_path, record, DownAsk(grace=1.0), 5)
    assert answer is not None and answer.stop == report and type(answer.stop) is StopReport
    assert answer.backend == released and type(answer.backend) is BackendReport and not answer.stop.clean
    assert DownReply.from_wire(DownReply(None).to_wire()) == DownReply(None, None)


def test_an_answer_this_tfctl_cannot_read_is_no_answer(tmp_path: Path) -> None:
    record = this_process_controls(tmp_path)
    with live.ControllerDoor(live.socket_path(tmp_path), {DownAsk: lambda request: StatusReply({})}):
        assert live.ask(tmp_path, record, DownAsk(), 5) is None  # `down` then reaches the hosts itself


def test_notes_from_a_controller_of_an_older_tfctl_are_read() -> None:
    part = LogsPart.from_wire({"notes": [["worker:0", "waits", "start ps:0"]]})  # no text, no errors
    assert part == LogsPart(notes=[LogNote("worker:0", "waits", "start ps:0")])


def test_a_door_answers_from_the_moment_its_socket_can_be_seen(tmp_path: Path) -> None:
    """Another terminal that finds the socket connects at once; a socket seen before it listened
    sent that terminal to the hosts (and failed a fast `status` right after `up`)."""
    import threading

    record = this_process_controls(tmp_path)
    path = live.socket_path(tmp_path)
    refused: list[None] = []
    answered: list[StatusReply] = []
    for _ in range(300):
        opened = threading.Event()

        def asker(opened: threading.Event = opened) -> None:
            while not path.exists() and not opened.is_set():
                pass
            answer = live.ask(tmp_path, record, StatusAsk(), 5)
            if answer is None:
                refused.append(answer)
            else:
                answered.append(answer)

        thread = threading.Thread(target=asker)
        thread.start()
        with live.ControllerDoor(path, {StatusAsk: lambda request: StatusReply({"ok": True})}):
            opened.set()
            thread.join(10)
    assert (len(refused), len(answered)) == (0, 300)
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing left: no socket, no name it was bound under


def test_a_run_directory_too_deep_for_a_socket_address_still_gets_a_door(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert len(str(live.socket_path(deep))) > 108
    record = this_process_controls(tmp_path)
    with live.ControllerDoor(live.socket_path(deep), {StatusAsk: lambda request: StatusReply({"ok": True})}):
        assert live.ask(deep, record, StatusAsk(), 5) == StatusReply({"ok": True})


def test_a_door_on_another_host_is_asked_through_a_relay_process(tmp_path: Path) -> None:
    """A controller on another host (a batch job's node) is asked through a process joined to its
    door there: here the relay a Slurm step runs (`Backend.door_relay`), started on this host, to
    a path longer than a socket's name may be. A relay that ends, or says nothing, is no answer."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    door = live.socket_path(deep)
    served: list[int] = []

    def status(request: StatusAsk) -> StatusReply:
        served.append(request.usage_history)
        return StatusReply({"samples": request.usage_history})

    with live.ControllerDoor(door, {StatusAsk: status}):
        line = live._exchange_through([sys.executable, "-c", RELAY, str(door)], StatusAsk(60), 10)
        assert line is not None and json.loads(line) == {"ok": {"snapshot": {"samples": 60}}}
        assert served == [60]
        nowhere = live._exchange_through([sys.executable, "-c", RELAY, str(tmp_path / "none.sock")], StatusAsk(), 10)
        assert nowhere is None  # the relay found no door: it ends (3), with no answer
        began = time.monotonic()
        assert live._exchange_through([sys.executable, "-c", "import time; time.sleep(60)"], StatusAsk(), 0.5) is None
        assert time.monotonic() - began < 5  # given up on, and its process ended


def test_no_door_is_used_for_a_dead_foreign_or_silent_controller(tmp_path: Path) -> None:
    served = []
    ask = StatusAsk()

    def status(request: StatusAsk) -> StatusReply:
        served.append(1)
        return StatusReply({})

    with live.ControllerDoor(live.socket_path(tmp_path), {StatusAsk: status}):
        elsewhere = this_process_controls(tmp_path, host="another-machine")
        assert live.ask(tmp_path, elsewhere, ask, 5) is None
        dead = this_process_controls(tmp_path, starttime=1)  # this pid, but another process's start
        assert live.ask(tmp_path, dead, ask, 5) is None
        ended = this_process_controls(tmp_path).replace(state=RunState.SUCCEEDED)
        assert live.ask(tmp_path, ended, ask, 5) is None
    assert served == []
    # A socket file nobody listens on (its controller was SIGKILLed): no answer, no error.
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(live.socket_path(tmp_path)))
    stale.close()
    assert live.ask(tmp_path, this_process_controls(tmp_path), ask, 5) is None


def test_a_controller_that_does_not_answer_in_time_is_passed_over(tmp_path: Path) -> None:
    def late_status(request):
        time.sleep(3)  # deliberately longer than the asker waits
        return StatusReply({})

    with live.ControllerDoor(live.socket_path(tmp_path), {StatusAsk: late_status}):
        began = time.monotonic()
        assert live.ask(tmp_path, this_process_controls(tmp_path), StatusAsk(), 0.5) is None
        assert time.monotonic() - began < 2


# ------------------------------------------------------------------ end to end, on localhost


def spans(trace_file: Path) -> list[str]:
    return [json.loads(line)["event"] for line in trace_file.read_text().splitlines()]


def sleeper_cluster(dirpath: Path) -> tuple[Path, list[int]]:
    ports = free_ports(3)
    path = dirpath / "cluster.yaml"
    task = f"{{python}} {FAKE_TASK} --name {{job_name}}{{task_index}} --sleep -1 --port"
    path.write_text(f"""name: door
grace_period: 2
jobs:
  ps:
    hosts: [localhost:{ports[0]}]
    command: "{task} {ports[0]}"
  worker:
    hosts: [localhost:{ports[1]}, localhost:{ports[2]}]
    command: "{task} $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]}))"
""")
    return path, ports


def wait_listening(cluster: Path, home: Path) -> list[dict[str, Any]]:
    def tasks() -> list[dict[str, Any]]:
        shown = tfctl("-f", str(cluster), "status", "--json", home=home)  # fails until the run is recorded
        return json.loads(shown.stdout)["tasks"] if shown.returncode == 0 else []

    return wait_until(
        tasks,
        20,
        "every task listening",
        until=lambda tasks: tasks and all(t["listening"] for t in tasks),
        interval=0.2,
    )


def test_status_and_down_go_through_the_detached_watcher(tmp_path: Path, home: Path) -> None:
    cluster, ports = sleeper_cluster(tmp_path)
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    watcher = RunStore(home).load(run_id).watcher
    assert watcher is not None
    assert all(t["listening"] for t in wait_listening(cluster, home))

    traced = tmp_path / "status.trace"
    shown = tfctl("--trace", str(traced), "-f", str(cluster), "status", home=home)
    assert shown.returncode == 0, shown.stderr
    assert run_id in shown.stdout and shown.stdout.count("  running  ") == 3
    assert "live.ask" in spans(traced)
    assert not [e for e in spans(traced) if e.startswith(("agent.", "transport."))]  # no host contacted

    traced = tmp_path / "logs.trace"
    tail = tfctl("--trace", str(traced), "-f", str(cluster), "logs", "--tail", "1", "worker", home=home)
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines() == ["[worker:0] worker0 line 2", "[worker:1] worker1 line 2"]
    assert "live.stream" in spans(traced)
    assert not [e for e in spans(traced) if e.startswith(("agent.", "transport."))]
    follower = spawn_tfctl("-f", str(cluster), "logs", "-f", "ps", home=home)

    traced = tmp_path / "down.trace"
    down = tfctl("--trace", str(traced), "-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert "5 processes stopped on 1 host; 0 remain" in down.stderr
    assert not [e for e in spans(traced) if e.startswith(("agent.", "transport."))]
    out, err = follower.communicate(timeout=30)  # `logs -f` through the watcher ends with the run
    assert follower.returncode == 0, err
    lines = out.splitlines()
    assert all(line.startswith("[ps:0] ") for line in lines)
    texts = [line.split(None, 1)[1] for line in lines]
    assert texts[0].startswith("ps0 started") and texts[1:4] == ["ps0 line 0", "ps0 line 1", "ps0 line 2"]
    assert not is_running(watcher)  # it ended once it had answered
    assert not [p for p, (_, run) in marked_processes().items() if run == run_id]
    assert not any(port_listening(p) for p in ports)
    assert not live.socket_path(RunStore(home).run_dir(run_id)).exists()
    ended = RunStore(home).load(run_id)
    assert (ended.state.value, ended.reason) == ("stopped", "tfctl down")


def test_a_killed_watcher_leaves_status_and_down_to_reach_the_hosts(tmp_path: Path, home: Path) -> None:
    cluster, ports = sleeper_cluster(tmp_path)
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    wait_listening(cluster, home)
    watcher = RunStore(home).load(run_id).watcher
    assert watcher is not None
    os.kill(watcher.pid, signal.SIGKILL)
    wait_until(lambda: not is_running(watcher), 10, "the killed watcher gone", interval=0.02)
    assert live.socket_path(RunStore(home).run_dir(run_id)).exists()  # left behind by the kill

    traced = tmp_path / "status.trace"
    shown = tfctl("--trace", str(traced), "-f", str(cluster), "status", "--json", home=home)
    assert shown.returncode == 0, shown.stderr
    assert [t["state"] for t in json.loads(shown.stdout)["tasks"]] == ["running"] * 3
    assert "is gone; a new watcher" in shown.stderr
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert not [p for p, (_, run) in marked_processes().items() if run == run_id]
    assert not any(port_listening(p) for p in ports)


def test_status_and_down_go_through_an_attached_up(tmp_path: Path, home: Path) -> None:
    cluster, ports = sleeper_cluster(tmp_path)
    attached = spawn_tfctl("-f", str(cluster), "up", home=home, stdout=subprocess.DEVNULL)
    try:
        tasks = wait_listening(cluster, home)
        assert all(t["listening"] for t in tasks)
        traced = tmp_path / "status.trace"
        shown = tfctl("--trace", str(traced), "-f", str(cluster), "status", "--json", home=home)
        assert [t["state"] for t in json.loads(shown.stdout)["tasks"]] == ["running"] * 3
        assert "live.ask" in spans(traced)
        assert not [e for e in spans(traced) if e.startswith(("agent.", "transport."))]
        down = tfctl("-f", str(cluster), "down", home=home)
        assert down.returncode == 0, down.stderr
        assert "processes stopped on 1 host; 0 remain" in down.stderr
        _, err = attached.communicate(timeout=30)
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait()
    assert "job stopped: tfctl down\n" in err and attached.returncode == 1
    record = RunStore(home).all()[-1]
    assert (record.state, record.reason) == (RunState.STOPPED, "tfctl down")
    run_id = record.run_id
    assert not [p for p, (_, run) in marked_processes().items() if run == run_id]
    assert not any(port_listening(p) for p in ports)


def test_a_stopped_controller_is_passed_over_by_logs(tmp_path: Path, home: Path) -> None:
    """A watcher that answers nothing (SIGSTOP, a hung machine) must not hang `logs -f`: it
    waits a few seconds for the stream to start, then reads the hosts itself (`status` waits
    STATUS_PATIENCE, as the unit test of `ask` shows)."""
    cluster, _ports = sleeper_cluster(tmp_path)
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    wait_listening(cluster, home)
    watcher = RunStore(home).load(run_id).watcher
    assert watcher is not None
    os.kill(watcher.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        logs = tfctl("-f", str(cluster), "logs", "--tail", "1", "ps", home=home, timeout=60)
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout.split(None, 1)[1].strip() == "ps0 line 2"
        assert time.monotonic() - began < live.CONNECT_PATIENCE + 10
    finally:
        os.kill(watcher.pid, signal.SIGCONT)
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert not [p for p, (_, run) in marked_processes().items() if run == run_id]
