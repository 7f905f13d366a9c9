"""A run's life on the fake backend, in this process: attached supervision with its logs,
restarts, success policies, Ctrl-C, the hang judge, a host lost, refused and failed starts.

Each test drives the controller's own code (`controller/up`, `supervise`, `down`) against the
fake lab's hosts (tests/fakes.py) and asserts what it recorded, stopped and said."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.fake_runs import FAKE_FILE, amend, sigterm_kept, started, write
from tests.fakes import TaskScript
from tfctl.cluster.cluster import Cluster
from tfctl.config.devices import DeviceError
from tfctl.config.loader import load_config
from tfctl.controller.live import driver, launch
from tfctl.controller.live.resubmit import recorded_config
from tfctl.controller.live.watcher import controller_of_this_process
from tfctl.controller.verbs import down, up
from tfctl.engine.clock import Cancel
from tfctl.engine.verdicts import Outcome
from tfctl.errors import StartupError, UsageError
from tfctl.runs.record import ControllerKind
from tfctl.runs.store import RunStore
from tfctl.supervisor import protocol as p
from tfctl.supervisor.protocol import RestartRule, RunState, TaskState

WAITING = "CreateSession still waiting for response from worker: /job:ps/replica:0/task:0"


def attach(cluster: Cluster, store: RunStore) -> tuple[driver.Ending, list[tuple[str, str]]]:
    lines: list[tuple[str, str]] = []
    with cluster:
        ending = driver.attach(store, cluster, lines.extend)
    assert cluster.record == store.load(cluster.record.run_id)  # one writer: memory and store stay one
    return ending, lines


def test_an_attached_run_streams_every_tasks_lines_then_stops_the_ps_and_releases(tmp_path, fake_backend):
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(lines=["ps: listening"]),
            "worker:0": TaskScript(end_after=3, lines=["step 1", "step 2"]),
            "worker:1": TaskScript(end_after=2, lines=["step 1"]),
        }
    )
    store, cluster = started(write(tmp_path), attached=True)
    run_id = cluster.record.run_id
    assert cluster.record.watcher is not None and cluster.record.watcher.attached
    ending, lines = attach(cluster, store)
    assert ending.outcome.state is RunState.SUCCEEDED and ending.outcome.reason == "worker:0 finished successfully"
    assert [line for task, line in lines if task == "worker:0"] == ["step 1", "step 2"]
    assert ("ps:0", "ps: listening") in lines and ("worker:1", "step 1") in lines
    assert fake_backend.hosts["h1"].tasks["ps:0"].state is TaskState.STOPPED
    assert ending.stop.clean and ending.stop.ports == [2222, 2223]
    record = store.load(run_id)
    assert record.state is RunState.SUCCEEDED and record.left_nothing and fake_backend.released == [run_id]
    verbs = fake_backend.journal.verbs("h1")
    assert verbs.index("follow") < verbs.index("stop")  # followed while it ran, stopped at the end
    assert not (store.run_dir(run_id) / "control.sock").exists()  # its door closed with it


@pytest.mark.parametrize(
    ("policy", "first_end", "restarted"),
    [
        ("on-failure", {"exit_code": 1}, True),
        ("exit-code", {"exit_code": 1}, False),  # 1-127: the program's own verdict, permanent
        ("exit-code", {"exit_code": 137}, True),
        ("exit-code", {"signal": 9}, True),
    ],
)
def test_a_restart_policy_goes_to_the_hosts_and_a_restarted_worker_can_still_succeed(
    tmp_path, fake_backend, policy, first_end, restarted
):
    restart = f"  chief:\n    hosts: [h2:2223]\n    restart: {{policy: {policy}, max_restarts: 2, backoff: 0}}\n"
    fake_backend.scripts["chief:0"] = TaskScript(end_after=2, **first_end, after_restart=TaskScript(end_after=2))
    store, cluster = started(write(tmp_path, extra=restart), attached=True)
    ending, _ = attach(cluster, store)
    assert fake_backend.hosts["h2"].launches["chief:0"].restart == RestartRule(policy, 2, 0.0)
    assert fake_backend.hosts["h1"].launches["worker:0"].restart is None  # only the chief's job restarts
    info = fake_backend.hosts["h2"].tasks["chief:0"]
    if restarted:
        assert ending.outcome.state is RunState.SUCCEEDED, ending.outcome
        assert info.restarts == 1 and info.state is TaskState.SUCCEEDED
    else:
        assert ending.outcome.state is RunState.FAILED
        assert ending.outcome.reason == "chief:0 on h2 exited with code 1" and ending.outcome.culprit == "chief:0"


def test_a_worker_failing_past_its_restarts_fails_the_run_saying_each_earlier_end(tmp_path, fake_backend):
    text = FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", "  worker:\n    hosts: [h1:2223, h2:2222]\n")
    text += "    restart: {policy: on-failure, max_restarts: 2, backoff: 0}\n"
    fake_backend.scripts["worker:0"] = TaskScript(end_after=1, exit_code=3)
    store, cluster = started(write(tmp_path, text), attached=True)
    ending, _ = attach(cluster, store)
    assert ending.outcome.reason == (
        "worker:0 on h1 exited with code 3 (after 2 restarts; before: exited with code 3, exited with code 3)"
    )
    assert store.load(cluster.record.run_id).state is RunState.FAILED
    assert fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.STOPPED  # the rest was stopped


def test_all_workers_policy_waits_for_every_worker_and_chief_policy_for_worker_0(tmp_path, fake_backend):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=1)
    fake_backend.scripts["worker:1"] = TaskScript(end_after=6)
    store, cluster = started(write(tmp_path, extra="success_policy: all_workers\n"), attached=True)
    ending, _ = attach(cluster, store)
    assert ending.outcome.reason == "worker:0, worker:1 finished successfully"
    assert fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.SUCCEEDED  # waited for

    fake_backend.hosts.clear()
    store, cluster = started(write(tmp_path), attached=True)  # the default: worker 0 decides
    ending, _ = attach(cluster, store)
    assert ending.outcome.reason == "worker:0 finished successfully"
    assert fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.STOPPED  # not waited for


def test_a_ps_that_ends_while_the_job_runs_fails_it_unless_the_file_says_otherwise(tmp_path, fake_backend):
    fake_backend.scripts["ps:0"] = TaskScript(end_after=1)
    fake_backend.scripts["worker:0"] = TaskScript(end_after=4)
    store, cluster = started(write(tmp_path), attached=True)
    ending, _ = attach(cluster, store)
    assert ending.outcome.state is RunState.FAILED and ending.outcome.culprit == "ps:0"
    assert ending.outcome.reason == "ps:0 on h1 ended while the job was running (exited with code 0)"

    fake_backend.hosts.clear()
    store, cluster = started(write(tmp_path, extra="fail_on_ps_exit: false\n"), attached=True)
    ending, _ = attach(cluster, store)
    assert ending.outcome.state is RunState.SUCCEEDED


def test_a_request_on_the_cancel_token_stops_the_attached_run_and_reads_its_last_lines(tmp_path, fake_backend):
    fake_backend.scripts["worker:1"] = TaskScript(lines=["one line, then Ctrl-C"])
    store, cluster = started(write(tmp_path), attached=True)  # runs until stopped
    run_id = cluster.record.run_id
    stopping, lines = Cancel(), []

    def ctrl_c(batch: list[tuple[str, str]]) -> None:  # the edge: Ctrl-C becomes a request
        lines.extend(batch)
        if batch:
            stopping.set("interrupted (Ctrl-C)")

    with cluster:
        ending = driver.attach(store, cluster, ctrl_c, stopping=stopping)
    assert ending.outcome == Outcome(RunState.STOPPED, "interrupted (Ctrl-C)") and ending.handed_over is None
    assert ending.stop.processes == 3 and ending.stop.clean
    assert ("worker:1", "one line, then Ctrl-C") in lines
    record = store.load(run_id)
    assert (record.state, record.reason) == (RunState.STOPPED, "interrupted (Ctrl-C)")
    assert not (store.run_dir(run_id) / "control.sock").exists()
    assert fake_backend.released == [run_id]


def test_a_second_ctrl_c_while_attached_leaves_the_run_up_for_down(tmp_path, fake_backend):
    fake_backend.scripts["worker:1"] = TaskScript(lines=["one line, then Ctrl-C"])
    store, cluster = started(write(tmp_path), attached=True)  # runs until stopped
    run_id = cluster.record.run_id

    def ctrl_c(batch: list[tuple[str, str]]) -> None:
        raise KeyboardInterrupt

    with cluster:
        with pytest.raises(KeyboardInterrupt):
            driver.attach(store, cluster, ctrl_c)
        assert store.load(run_id).active and fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.RUNNING
        assert not (store.run_dir(run_id) / "control.sock").exists()
        report = driver.finish(store, cluster, Outcome(RunState.STOPPED, "tfctl down")).stop
    assert report.processes == 3 and report.clean
    record = store.load(run_id)
    assert (record.state, record.reason) == (RunState.STOPPED, "tfctl down")
    assert fake_backend.released == [run_id]


def test_a_task_stuck_on_a_peer_past_hang_timeout_fails_the_run_explained(tmp_path, fake_backend, monkeypatch):
    fake_backend.scripts["worker:1"] = TaskScript(lines=["starting", WAITING])
    store, cluster = started(write(tmp_path, extra="hang_timeout: 0.01\n"), attached=True)
    ending, _ = attach(cluster, store)
    outcome = ending.outcome
    assert outcome.state is RunState.FAILED and outcome.culprit == "worker:1"
    assert outcome.reason.startswith(  # what it waits for, as found by asking the hosts
        "worker:1 has been stuck for over 0.01s: ps:0 is running and reachable at h1:2222 from h2, so it is not what"
    )
    assert "(fix: " in outcome.reason and "probe" in fake_backend.journal.verbs("h2")
    assert fake_backend.hosts["h1"].tasks["ps:0"].state is TaskState.STOPPED


def test_a_host_silent_past_host_timeout_fails_the_run_and_the_stop_says_it_was_unchecked(
    tmp_path, fake_backend, monkeypatch
):
    fake_backend.scripts["worker:0"] = TaskScript(lines=["step 1"])
    store, cluster = started(write(tmp_path, extra="host_timeout: 0.05\n"), attached=True)
    run_id = cluster.record.run_id
    noted: list[dict[str, float]] = []
    real_save = store.save

    def save(stored: Any) -> None:
        real_save(stored)
        if stored.unreachable and (not noted or noted[-1] != stored.unreachable):
            noted.append(dict(stored.unreachable))

    monkeypatch.setattr(store, "save", save)

    def h2_goes_down(request: p.Request[Any]) -> None:
        if request.VERB == "status" and fake_backend.journal.verbs("h2").count("status") > 2:
            fake_backend.hosts["h2"].down = True

    fake_backend.hosts["h2"].before = h2_goes_down
    ending, lines = attach(cluster, store)
    lost = r"lost contact with h2 since \d\d:\d\d:\d\d \(0\.05s, host_timeout\): h2: connection refused"
    assert re.fullmatch(lost, ending.outcome.reason), ending.outcome.reason
    assert noted and list(noted[0]) == ["h2"]  # recorded for `status` while it lasted
    assert ending.stop.unreachable == {"h2": "h2: connection refused"} and not ending.stop.clean
    record = store.load(run_id)
    assert record.state is RunState.FAILED and not record.left_nothing and list(record.unreachable) == ["h2"]
    assert ("worker:0", "step 1") in lines


def test_the_backend_ending_an_attached_run_fails_it(tmp_path, fake_backend):
    store, cluster = started(write(tmp_path), attached=True)
    fake_backend.end_run(cluster.record.run_id)
    ending, _ = attach(cluster, store)
    assert ending.outcome.reason == f"the fake pool ended run {cluster.record.run_id}"


# ---------------------------------------------------------------- what refuses or fails a start


def test_a_second_up_is_refused_while_the_run_lives_or_starts_and_allowed_once_it_is_over(tmp_path, fake_backend):
    path = write(tmp_path)
    config = load_config(path)
    store, cluster = started(path)
    run_id = cluster.record.run_id
    with pytest.raises(UsageError, match=rf"run {run_id} of cluster 'fake' is still running \(3 tasks: ps:0, wor"):
        up.ensure_no_live_run(store, config)
    amend(store, run_id, state=RunState.STARTING, watcher=controller_of_this_process(ControllerKind.UP))
    with pytest.raises(UsageError, match=r"is starting .*its `tfctl up` is pid") as caught:
        up.ensure_no_live_run(store, config)
    assert caught.value.hint and "Ctrl-C in its terminal" in caught.value.hint
    fake_backend.end_run(run_id)  # its backend knows it is over: no host is asked
    asked = len(fake_backend.journal.entries)
    up.ensure_no_live_run(store, config)
    assert len(fake_backend.journal.entries) == asked
    fake_backend.ended.clear()
    amend(store, run_id, watcher=None)
    report, released = down.down(store, store.load(run_id), grace=0)
    assert report.clean and released is not None and released.line() == "fake pool: released"
    cluster.close()
    up.ensure_no_live_run(store, config)  # its stop proved nothing left


def test_busy_task_ports_refuse_the_start_before_anything_is_recorded_or_kept(tmp_path, fake_backend):
    fake_backend.agent("h2")._ports = lambda request: p.PortsAnswer(
        {str(port): p.PortInfo(True, [4321], "python old_run.py") for port in request.ports}
    )
    with pytest.raises(StartupError, match="task ports already in use") as caught:
        started(write(tmp_path))
    assert "h2:2222: in use by pid 4321 (python old_run.py)" in caught.value.message
    hint = caught.value.hint or ""
    assert "`tfctl down --all`" in hint and "without a port" in hint
    assert not RunStore().all() and fake_backend.released and not fake_backend.leases
    assert "start" not in fake_backend.journal.verbs()


def test_ports_held_by_a_live_run_of_another_file_are_freed_by_its_own_down(tmp_path, fake_backend):
    """`down --all` leaves another file's live run alone: the hint names that run's own `down`."""
    other = tmp_path / "other"
    other.mkdir()
    _store, first = started(write(other))
    first.close()
    fake_backend.agent("h2")._ports = lambda request: p.PortsAnswer(
        {str(port): p.PortInfo(True, [4321], "train") for port in request.ports}
    )
    with pytest.raises(StartupError, match="task ports already in use") as caught:
        started(write(tmp_path))
    run_id = first.record.run_id
    down_first = f"tfctl -f {other}/cluster.yaml down --run {run_id}"
    assert caught.value.hint == f"they are run {run_id}'s: stop it with `{down_first}`"
    down.down(RunStore(), RunStore().load(run_id), grace=0)


def test_a_task_that_cannot_start_fails_the_run_stops_the_rest_and_releases(tmp_path, fake_backend):
    fake_backend.scripts["worker:1"] = TaskScript(exits_at_start=True, lines=["train: not found"])
    said: list[tuple[str, str]] = []
    store = RunStore()
    plan = up.acquire(store, load_config(write(tmp_path)), lambda *_: None)
    with pytest.raises(StartupError) as caught:
        launch.launch(store, plan, lambda who, what: said.append((who, what)))
    assert caught.value.message.splitlines() == [
        "worker:1 could not start: No such file or directory",
        "last line of worker:1:",  # one line: not "last 1 lines"
        "  train: not found",
    ]
    record = store.load(plan.record.run_id)
    assert (record.state, record.reason) == (RunState.FAILED, "worker:1 could not start: No such file or directory")
    assert ("", "stopping what was started") in said
    assert fake_backend.hosts["h1"].tasks["ps:0"].state is TaskState.STOPPED
    assert fake_backend.released == [plan.record.run_id] and all(h.closed for h in fake_backend.hosts.values())


def test_ctrl_c_during_the_start_records_the_run_stopped(tmp_path, fake_backend):
    def interrupt(request: p.Request[Any]) -> None:
        if request.VERB == "probe":
            raise KeyboardInterrupt

    fake_backend.agent("h1").before = interrupt
    store = RunStore()
    plan = up.acquire(store, load_config(write(tmp_path)), lambda *_: None)
    with pytest.raises(KeyboardInterrupt):
        launch.launch(store, plan, lambda *_: None)
    record = store.load(plan.record.run_id)
    assert (record.state, record.reason) == (RunState.STOPPED, "interrupted during start")
    assert fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.STOPPED
    assert fake_backend.released == [plan.record.run_id]


def test_hosts_that_differ_are_warned_of_and_tasks_are_placed_on_what_each_host_has(tmp_path, fake_backend):
    h2 = fake_backend.agent("h2")
    h2._info = lambda request: p.InfoAnswer(
        "h2", "3.11.7", "3.12.1", None, "python3: bad interpreter", cpus=[0, 1], gpus=[p.Gpu(0, "GPU-0")]
    )
    fake_backend.agent("h1").gpus = [0, 1]
    text = FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", "  worker:\n    hosts: [h1:2223, h2:2222]\n")
    text += "    gpus: 1\n"
    said: list[tuple[str, str]] = []
    store = RunStore()
    plan = up.acquire(store, load_config(write(tmp_path, text)), lambda *_: None)
    with launch.launch(store, plan, lambda who, what: said.append((who, what)), detach=True) as cluster:
        warnings = [what for who, what in said if who == "warning"]
        assert warnings == [
            "python differs across hosts (h1: 3.11.7, h2: 3.12.1)",
            "tensorflow differs across hosts (h1: tensorflow 2.21.0, h2: none)",
            "h2: the configured python does not run: python3: bad interpreter",
        ]
        assert ("h1", "ok: python 3.11.7, tensorflow 2.21.0, 2 GPUs") in said
        placed = {t.name: (t.gpus, t.env.get("CUDA_VISIBLE_DEVICES")) for t in cluster.record.tasks}
        assert placed == {"ps:0": ((), ""), "worker:0": ((0,), "0"), "worker:1": ((0,), "0")}
        assert fake_backend.hosts["h1"].launches["worker:0"].env["CUDA_VISIBLE_DEVICES"] == "0"
        driver.finish(store, cluster, Outcome(RunState.STOPPED, "tfctl down"))

    fake_backend.hosts.clear()
    fake_backend.released.clear()
    fake_backend.journal.entries.clear()
    with pytest.raises(DeviceError, match="h2"):  # h2 has no GPU now: nothing starts
        started(write(tmp_path, text))
    assert fake_backend.journal.verbs() == ["info", "info"] and len(fake_backend.released) == 1


# ---------------------------------------------------------------- the watcher's bodies (what `up -d` forks)


def test_the_watcher_that_up_d_forks_starts_the_run_reports_and_watches_it_to_its_end(tmp_path, fake_backend):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=2)
    store = RunStore()
    plan = up.acquire(store, load_config(write(tmp_path)), lambda *_: None)
    reports: list[dict[str, Any]] = []
    with sigterm_kept():
        ending = driver.launch_and_watch(store, plan, False, reports.append)
    assert ending is not None and ending.outcome.reason == "worker:0 finished successfully"
    assert reports[0] == {"progress": ["h1", "connecting"]} and reports[-1] == {"running": True}
    said = [tuple(r["progress"]) for r in reports if "progress" in r]
    assert said.index(("ps:0", "starting on h1")) < said.index(("ps:0", "running (pid 1000)"))
    assert said[-1] == ("", "reachability: 2 hosts -> h1:2222: all 2 connections ok")
    record = store.load(plan.record.run_id)
    assert record.state is RunState.SUCCEEDED and record.watcher is not None and not record.watcher.attached


def test_the_forked_watcher_reports_a_failed_start_as_its_last_word(tmp_path, fake_backend):
    fake_backend.scripts["ps:0"] = TaskScript(exits_at_start=True)
    store = RunStore()
    plan = up.acquire(store, load_config(write(tmp_path)), lambda *_: None)
    reports: list[dict[str, Any]] = []
    with sigterm_kept():
        assert driver.launch_and_watch(store, plan, False, reports.append) is None
    assert reports[-1] == {
        "error": "ps:0 could not start: No such file or directory",
        "hint": None,
        "exit_code": 1,
        "kind": "StartupError",  # (rebuilt as that class by the `up` that reads it)
    }


def test_a_new_watcher_supervises_a_running_run_to_its_end_and_ignores_an_ended_one(tmp_path, fake_backend):
    fake_backend.scripts["worker:0"] = TaskScript(end_after=2)
    store, cluster = started(write(tmp_path))
    cluster.close()
    with sigterm_kept():
        ending = driver.watch(store, cluster.record.run_id)
        assert ending is not None and ending.outcome.state is RunState.SUCCEEDED
        assert driver.watch(store, cluster.record.run_id) is None  # over: nothing to watch


def test_a_watcher_told_to_end_by_sigterm_stops_nothing(tmp_path, fake_backend):
    store, cluster = started(write(tmp_path))
    stopping = Cancel()
    stopping.set()
    with cluster:
        assert driver._watch(store, cluster, stopping) is None
    assert store.load(cluster.record.run_id).active
    assert "stop" not in fake_backend.journal.verbs()
    down.down(store, store.load(cluster.record.run_id), grace=0)


# ---------------------------------------------------------------- the reachability check at start


@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_ps_that_ended_before_the_probe_is_judged_by_its_end_not_as_a_network_fault(
    tmp_path, fake_backend, exit_code
):
    """A quick task can listen, be seen listening, and be gone when the other hosts probe it: the
    refused connection is then no network fault (CI once failed a 3-host run on it)."""
    fake_backend.scripts["ps:0"] = TaskScript(end_after=2, exit_code=exit_code)  # seen listening, then gone
    for host in ("h1", "h2"):
        fake_backend.agent(host).refused.add("h1:2222")
    if exit_code == 0:
        store, cluster = started(write(tmp_path))
        assert cluster.record.task("ps:0").host == "h1"
        assert fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.RUNNING
        down.down(store, store.load(cluster.record.run_id), None)
    else:
        with pytest.raises(StartupError, match=r"^ps:0 exited with code 1") as failed:
            started(write(tmp_path))
        assert "reachability" not in str(failed.value)


def test_a_ps_refused_as_it_exits_is_looked_at_again_until_its_monitor_records_the_end(tmp_path, fake_backend):
    """The process is gone (refused) a moment before its monitor has written its end: the first
    looks after the refusal still say running (CI failed a resumed run that finished at once)."""
    fake_backend.scripts["ps:0"] = TaskScript(end_after=6)  # refused from the first probe, ended 3 looks later
    for host in ("h1", "h2"):
        fake_backend.agent(host).refused.add("h1:2222")
    store, cluster = started(write(tmp_path))
    assert fake_backend.hosts["h1"].tasks["ps:0"].state is TaskState.SUCCEEDED
    assert fake_backend.hosts["h2"].tasks["worker:1"].state is TaskState.RUNNING
    down.down(store, store.load(cluster.record.run_id), None)


def test_a_ps_still_running_but_refused_fails_the_start_as_a_network_fault(tmp_path, fake_backend):
    fake_backend.agent("h2").refused.add("h1:2222")
    with pytest.raises(StartupError, match=r"1 of 2 connections failed in the reachability check") as failed:
        started(write(tmp_path))
    assert "h2 -> h1:2222: connection refused" in str(failed.value)
    assert all(info.state is TaskState.STOPPED for h in fake_backend.hosts.values() for info in h.tasks.values())


def test_a_run_keeps_its_cluster_file_and_a_resubmission_reads_that_not_the_edited_file(tmp_path, fake_backend):
    """Hours into a run its file may be edited for the next one: the run re-planned in a new
    allocation is still the run that started."""
    fake_backend.scripts["worker:0"] = TaskScript(end_after=2)
    store = RunStore()
    path = write(tmp_path)
    started = path.read_text()
    plan = up.acquire(store, load_config(path), lambda *_: None)
    with sigterm_kept():
        driver.launch_and_watch(store, plan, False, lambda _report: None)
    path.write_text(started + "grace_period: 7\n")
    record = store.load(plan.record.run_id)
    assert load_config(path).grace_period == 7  # the file as it is now
    assert recorded_config(store, record).grace_period == 10  # the run as it started (the default)
    assert (store.run_dir(record.run_id) / "cluster.yaml").stat().st_mode & 0o777 == 0o600
