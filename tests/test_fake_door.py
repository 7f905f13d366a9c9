"""A live controller's door on the fake backend, in this process: `status`, `logs` and `down`
typed in another terminal while an attached `up` (or the detached watcher) runs, answered over
its Unix socket with the connections it holds; and a run whose controller died.

The controller runs on a thread (`in_thread`), the other terminal is `cli.main` on this one."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.fake_runs import amend, in_thread, returned, started, tfctl_here, write
from tests.fakes import TaskScript
from tfctl.backends.base import BackendReport
from tfctl.controller.live import driver, watcher
from tfctl.controller.live import rpc as live
from tfctl.controller.live.rpc_messages import DoorRequest, DownAsk, DownReply, StatusAsk
from tfctl.controller.live.watcher import controller_of_this_process
from tfctl.controller.views.status_view import Snapshot
from tfctl.engine.clock import Cancel
from tfctl.runs.record import Controller, ControllerKind
from tfctl.runs.store import RunStore
from tfctl.supervisor.files import host_key
from tfctl.supervisor.protocol import RunState, TaskState


@pytest.fixture
def lab(fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(lines=["ps: listening"]),
            "worker:0": TaskScript(lines=["step 1", "step 2"]),  # runs until stopped
            "worker:1": TaskScript(lines=["step 1"]),
        }
    )
    return fake_backend


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """(verb, answered by the live controller) of every question another terminal asked it."""
    seen: list[tuple[str, bool]] = []
    real_ask, real_stream = live.ask, live.stream

    def ask(run_dir: Path, record: Any, request: DoorRequest[Any], timeout: float) -> Any:
        answer = real_ask(run_dir, record, request, timeout)
        seen.append((request.VERB, answer is not None))
        return answer

    def stream(run_dir: Path, record: Any, request: DoorRequest[Any]) -> Any:
        parts = real_stream(run_dir, record, request)
        seen.append((request.VERB, parts is not None))
        return parts

    monkeypatch.setattr(live, "ask", ask)
    monkeypatch.setattr(live, "stream", stream)
    return seen


def until(condition: Callable[[], bool], patience: float = 10.0) -> None:
    """Wait for `condition`, looking every 5 ms; fail after `patience` seconds."""
    deadline = time.monotonic() + patience
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        threading.Event().wait(0.005)


def door_open(store: RunStore, run_id: str) -> None:
    """Wait until the controller's door listens (it opens once supervision began)."""
    until(live.socket_path(store.run_dir(run_id)).exists)


def test_status_logs_and_down_from_another_terminal_go_through_the_attached_up(lab, tmp_path, asked):
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)
    run_id = cluster.record.run_id
    lines: list[tuple[str, str]] = []
    closed = {h: host.closed for h, host in lab.hosts.items()}
    with cluster, in_thread(lambda: driver.attach(store, cluster, lines.extend)) as ended:
        door_open(store, run_id)
        status = tfctl_here("status")
        assert status.code == 0 and status.out.startswith(f"{run_id}  (running)  fake pool: leased\n")
        answer = json.loads(tfctl_here("status", "--json").out)
        assert {t["task"]: t["state"] for t in answer["tasks"]} == dict.fromkeys(
            ["ps:0", "worker:0", "worker:1"], "running"
        )
        logs = tfctl_here("logs", "--tail", "1", "worker")
        assert logs.out.splitlines() == ["[worker:0] step 2", "[worker:1] step 1"]
        down = tfctl_here("down", "--grace", "0")
        assert down.code == 0, down.err
        assert down.err.splitlines() == [
            f"run {run_id}:",
            "3 processes stopped on 2 hosts; 0 remain; ports 2222-2223 free",
            "fake pool: released",
        ]
        assert {h: host.closed for h, host in lab.hosts.items()} == closed  # no terminal connected on its own
    assert asked == [("status", True), ("status", True), ("logs", True), ("down", True)]
    (ending,) = ended
    assert ending.outcome == driver.STOPPED_BY_DOWN  # the attached `up` stopped the run for the door's down
    assert (store.load(run_id).state, store.load(run_id).reason) == (RunState.STOPPED, "tfctl down")
    assert lab.released == [run_id]  # once
    assert lab.journal.verbs().count("stop") == 2  # once per host, by the attached `up`'s own thread
    assert ("worker:0", "step 2") in lines


def test_logs_f_through_the_attached_up_ends_when_the_run_does(lab, tmp_path, asked):
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)

    def worker_0_ends_once_logs_follows() -> None:
        until(lambda: lab.journal.verbs("h1").count("follow") == 2)  # the attached `up`'s, then `logs -f`'s
        lab.scripts["worker:0"].end_after = 1

    with cluster, in_thread(lambda: driver.attach(store, cluster, lambda batch: None)) as ended:
        with in_thread(worker_0_ends_once_logs_follows):
            door_open(store, cluster.record.run_id)
            logs = tfctl_here("logs", "-f")
    assert asked == [("logs", True)]
    assert logs.code == 0 and sorted(logs.out.splitlines()) == [
        "[ps:0]     ps: listening",
        "[worker:0] step 1",
        "[worker:0] step 2",
        "[worker:1] step 1",
    ]
    assert returned(ended).outcome.reason == "worker:0 finished successfully"


def test_status_and_down_go_through_the_detached_watcher_which_stops_the_run_itself(lab, tmp_path):
    store, cluster = started(tmp_path / "cluster.yaml", watcher=controller_of_this_process(ControllerKind.WATCHER))
    run_id, run_dir = cluster.record.run_id, store.run_dir(cluster.record.run_id)
    stopping = Cancel()
    with cluster, in_thread(lambda: driver._watch(store, cluster, stopping)) as ended:
        door_open(store, run_id)
        record = store.load(run_id)
        status = live.ask(run_dir, record, StatusAsk(), 5)
        assert status is not None
        shot = Snapshot.from_plain(status.snapshot)  # plain data, rendered by the terminal that asked
        assert shot.to_json(record)["run"]["state"] == "running" and {s.state for s in shot.statuses} == {
            TaskState.RUNNING
        }
        answer = live.ask(run_dir, record, DownAsk(grace=0), 5)
    assert ended == [None]  # a watcher told to stop by `down` ends without an outcome of its own
    assert answer is not None and answer.stop is not None
    assert answer.stop.processes == 3 and answer.stop.unreachable == {}
    assert answer.backend == BackendReport("fake pool", "released", True, {"pool": "gpus"})
    assert (store.load(run_id).state, store.load(run_id).reason) == (RunState.STOPPED, "tfctl down")
    assert all(info.state is TaskState.STOPPED for host in lab.hosts.values() for info in host.tasks.values())
    assert not live.socket_path(run_dir).exists()


def test_a_down_that_reaches_the_watcher_while_it_ends_the_run_hears_what_it_stopped(lab, tmp_path):
    lab.scripts["worker:0"] = TaskScript(end_after=2)
    store, cluster = started(tmp_path / "cluster.yaml", watcher=controller_of_this_process(ControllerKind.WATCHER))
    run_id, run_dir = cluster.record.run_id, store.run_dir(cluster.record.run_id)
    stopping = Cancel()  # what the door sets when a `down` arrives
    answers: list[Any] = []

    def down_arrives_during_the_stop(request: Any) -> None:
        if request.VERB == "stop" and not answers:
            asker = threading.Thread(
                target=lambda: answers.append(live.ask(run_dir, store.load(run_id), DownAsk(grace=0), 5))
            )
            asker.start()
            stopping.wait(5)  # the door has handed the `down` over: now let the watcher's stop go on
            answers.append(asker)

    lab.hosts["h1"].before = down_arrives_during_the_stop
    with cluster:
        ending = driver._watch(store, cluster, stopping)
    answers[0].join(5)
    assert ending is not None and ending.outcome.reason == "worker:0 finished successfully"
    assert answers[1] == DownReply(ending.stop, ending.backend)  # stopped once, by the watcher
    assert ending.backend == BackendReport("fake pool", "released", True, {"pool": "gpus"})
    assert lab.journal.verbs().count("stop") == 2  # one per host
    assert store.load(run_id).state is RunState.SUCCEEDED


def test_the_first_status_after_the_controller_died_is_true_when_the_job_had_ended(lab, tmp_path, monkeypatch):
    """Every task ended while nobody watched: the first `status` records how, as the new watcher
    would a moment later, instead of `(running)` and a lease to wait for."""
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)
    cluster.close()
    run_id = cluster.record.run_id
    dead = controller_of_this_process(ControllerKind.UP).replace(starttime=-1)
    amend(store, run_id, watcher=dead)
    for host in lab.hosts.values():  # the job went on and ended: worker:0 done, the rest stopped by their hosts
        for name, info in host.tasks.items():
            done = TaskState.SUCCEEDED if name == "worker:0" else TaskState.STOPPED
            host.tasks[name] = info.replace(state=done, exit_code=0 if done is TaskState.SUCCEEDED else None)
    monkeypatch.setattr(watcher, "spawn_watcher", lambda *_: pytest.fail("no watcher is needed for a decided run"))
    ran = tfctl_here("status")
    assert ran.code == 0, ran.err
    assert ran.err.startswith(f"warning: run {run_id}: the `tfctl up` that started it (pid {dead.pid}) is gone, and ")
    assert "its job had ended: recorded as succeeded (worker:0 finished successfully)" in ran.err
    assert "lease_timeout" not in ran.err and "(running)" not in ran.out
    assert store.load(run_id).state is RunState.SUCCEEDED


def test_status_of_a_run_whose_controller_died_starts_a_new_watcher_and_says_so(lab, tmp_path, monkeypatch):
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)
    cluster.close()
    run_id = cluster.record.run_id
    dead = controller_of_this_process(ControllerKind.UP).replace(starttime=-1)  # that pid is another process now
    amend(store, run_id, watcher=dead)
    fresh = Controller(ControllerKind.WATCHER, 4_000_000, 1, host_key())
    spawned: list[str] = []

    def spawn(store: RunStore, record: Any) -> Any:
        spawned.append(record.run_id)
        return amend(store, record.run_id, watcher=fresh)

    monkeypatch.setattr(watcher, "spawn_watcher", spawn)
    ran = tfctl_here("status")
    assert ran.code == 0 and spawned == [run_id]
    assert ran.err == (
        f"warning: run {run_id}: the `tfctl up` that started it (pid {dead.pid}) is gone; a new watcher "
        f"(pid 4000000) supervises it; its tasks stop on their hosts 60s after their controller (lease_timeout)\n"
    )
    assert tfctl_here("down").code == 0
