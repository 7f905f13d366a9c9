"""The verbs as a user types them, on the fake backend, in this process: `up` (attached, -d,
--dry-run), `status`, `logs`, `down`, `runs`, `check`, `export tfjob`, `init`, and the errors
`cli.main` turns into a sentence, a hint and an exit code.

Where a verb would fork or exec (`up -d`'s watcher), the fork is replaced by a call of the
function it runs, in this process; everything else runs as it does for a user."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.conftest import add_run
from tests.fake_runs import FAKE_FILE, sigterm_kept, started, tfctl_here, write
from tests.fakes import TaskScript
from tfctl.cli import render
from tfctl.controller.live import driver, watcher
from tfctl.errors import HostError
from tfctl.runs.store import RunStore
from tfctl.supervisor import protocol as p
from tfctl.supervisor.protocol import RunState, TaskState

OOM = "ResourceExhaustedError: OOM when allocating tensor with shape[4096,4096] and type float on /device:GPU:0"


@pytest.fixture
def lab(fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake lab, with ./cluster.yaml its cluster file (as most users run tfctl)."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    fake_backend.scripts.update(
        {
            "ps:0": TaskScript(lines=["ps: listening"]),
            "worker:0": TaskScript(end_after=3, lines=["step 1", "step 2"]),
            "worker:1": TaskScript(end_after=2, lines=["step 1"]),
        }
    )
    return fake_backend


def only_run() -> Any:
    (record,) = RunStore().all()
    return record


# ---------------------------------------------------------------- up


def test_up_follows_the_run_printing_its_lines_its_end_and_what_was_stopped(lab):
    ran = tfctl_here("up")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines() == [
        "[ps:0]     ps: listening",
        "[worker:0] step 1",
        "[worker:0] step 2",
        "[worker:1] step 1",
    ]
    record = only_run()
    said = [line.split("] ", 1)[-1].strip() for line in ran.err.splitlines()]
    assert said[:2] == ["fake         leased pool gpus", f"run {record.run_id}: 3 tasks on 2 fake hosts"]
    assert "all 3 tasks running" in said and "following all task logs; Ctrl-C stops the cluster" in said
    assert said[-2:] == [
        "job succeeded: worker:0 finished successfully",
        "2 tasks had ended; 1 process stopped on 2 hosts; 0 remain; ports 2222-2223 free",
    ]
    assert record.state is RunState.SUCCEEDED and lab.released == [record.run_id]


def test_up_of_a_failing_job_exits_1_with_the_culprits_diagnosis_and_who_never_trained(lab):
    lab.scripts["worker:0"] = TaskScript(end_after=2, exit_code=1, lines=["step 1", OOM])
    lab.scripts["worker:1"] = TaskScript(end_after=1, lines=["loading data"])
    ran = tfctl_here("up")
    assert ran.code == 1
    assert "worker:1: never logged a training step, while worker:0 did: it may not have trained\n" in ran.err
    assert "job failed: worker:0 on h1 exited with code 1\n" in ran.err
    assert "worker:0: " in ran.err and "out of memory" in ran.err.lower() and "  fix: " in ran.err
    assert only_run().state is RunState.FAILED


def test_a_run_that_fails_preflight_says_its_id_is_not_kept_as_runs_never_shows_it(lab, monkeypatch):
    lab.agent("h2").fail_verbs["info"] = HostError("h2", "python3: command not found")
    ran = tfctl_here("up")
    (run_id,) = re.findall(r"^run (\S+): 3 tasks", ran.err, re.M)
    assert ran.code == 1 and ran.err.endswith(
        f"error: h2: python3: command not found\nrun {run_id} not kept: nothing was started\n"
    ), ran.err
    fork_in_process(monkeypatch, io.StringIO())  # `up -d`: the forked watcher's start fails the same way
    ran = tfctl_here("up", "-d")
    (run_id,) = re.findall(r"^run (\S+): 3 tasks", ran.err, re.M)
    assert ran.code == 1 and ran.err.endswith(f"run {run_id} not kept: nothing was started\n"), ran.err
    assert RunStore().all() == [] and tfctl_here("runs").code == 0


def test_ctrl_c_while_acquiring_or_starting_leaves_nothing_behind(lab, monkeypatch):
    backend = type(watcher_backend())
    real_acquire = backend.acquire

    def interrupted(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(backend, "acquire", interrupted)
    ran = tfctl_here("up")
    assert (ran.code, ran.err) == (130, "interrupted: nothing acquired is left behind\n")
    monkeypatch.setattr(backend, "acquire", real_acquire)

    lab.agent("h1").before = lambda request: interrupted() if request.VERB == "probe" else None
    ran = tfctl_here("up")
    assert ran.code == 130 and ran.err.endswith("interrupted: everything started has been stopped\n")
    assert (only_run().state, only_run().reason) == (RunState.STOPPED, "interrupted during start")
    assert lab.hosts["h2"].tasks["worker:1"].state is TaskState.STOPPED and not lab.leases

    fork_in_process(monkeypatch, io.StringIO())  # `up -d`: the forked watcher is interrupted while starting
    ran = tfctl_here("up", "-d")
    assert ran.code == 130 and ran.err.endswith("interrupted: everything started has been stopped\n")


def test_up_d_whose_watcher_died_before_a_word_says_where_its_log_is(lab, monkeypatch):
    fork_in_process(monkeypatch, io.StringIO())

    def dead_watcher(_body: object) -> tuple[int, io.StringIO]:
        child = os.fork()
        if child == 0:
            os._exit(0)  # it died at once, before a word
        return child, io.StringIO("")

    monkeypatch.setattr(watcher, "fork_starter", dead_watcher)
    ran = tfctl_here("up", "-d")
    error, hint = ran.err.splitlines()[-2:]
    assert ran.code == 1 and re.fullmatch(
        r"error: run fake-\S+: its watcher \(pid \d+\) died during the start: what it started is stopped; "
        r"recorded as failed",
        error,
    ), error
    assert hint == "hint: its log is watch.log in the run's directory under $TFCTL_HOME/runs, if the run got that far"


def test_the_watcher_command_supervises_a_running_run_and_logs_how_it_ended(lab, tmp_path, monkeypatch):
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    monkeypatch.setattr(os, "nice", lambda increment: 0)
    with sigterm_kept():
        ran = tfctl_here("_watch", "--run", cluster.record.run_id)
    assert ran.code == 0
    assert ran.out == (
        "worker:0 finished successfully; 2 tasks had ended; 1 process stopped on 2 hosts; 0 remain; "
        "ports 2222-2223 free\n"
    )
    assert only_run().state is RunState.SUCCEEDED


def test_ctrl_c_stops_the_attached_run_and_a_second_one_leaves_it_to_down(lab, monkeypatch):
    for worker in ("worker:0", "worker:1"):  # each runs until stopped, however many looks it gets
        lab.scripts[worker] = TaskScript(lines=["step 1"])

    pressed: list[int] = []

    def ctrl_c(*_: Any) -> None:  # the user presses Ctrl-C once, as the first lines show
        if not pressed:
            pressed.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(render, "print_lines", ctrl_c)
    ran = tfctl_here("up")
    assert ran.code == 130
    assert "Ctrl-C: stopping the cluster (press Ctrl-C again to detach and leave it to `tfctl down`)" in ran.err
    assert ran.err.endswith("3 processes stopped on 2 hosts; 0 remain; ports 2222-2223 free\n")
    record = only_run()
    assert (record.state, record.reason) == (RunState.STOPPED, "interrupted (Ctrl-C)")

    lab.hosts.clear()
    real_stop = driver.stop_run

    def ctrl_c_again(*args: Any) -> Any:  # Ctrl-C again, while it stops
        os.kill(os.getpid(), signal.SIGINT)
        return real_stop(*args)

    pressed.clear()
    monkeypatch.setattr(driver, "stop_run", ctrl_c_again)
    ran = tfctl_here("up")
    assert ran.code == 130
    run_id = RunStore().all()[-1].run_id
    assert (
        "detached; tasks may still be running (they stop by themselves within 60s). "
        f"Stop them with: tfctl down --run {run_id}"
    ) in ran.err
    assert lab.hosts["h1"].tasks["worker:0"].state is TaskState.RUNNING
    ran = tfctl_here("down", "--run", run_id)
    assert ran.code == 0 and lab.hosts["h1"].tasks["worker:0"].state is TaskState.STOPPED


def test_a_sigterm_to_up_stops_the_run_and_says_sigterm_not_ctrl_c(lab, monkeypatch):
    for worker in ("worker:0", "worker:1"):
        lab.scripts[worker] = TaskScript(lines=["step 1"])
    sent: list[int] = []

    def sigterm(*_: Any) -> None:  # once: another would detach
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(render, "print_lines", sigterm)
    with sigterm_kept():
        ran = tfctl_here("up")
    assert ran.code == 130
    assert "SIGTERM: stopping the cluster" in ran.err and "Ctrl-C: stopping" not in ran.err
    assert ran.err.endswith("3 processes stopped on 2 hosts; 0 remain; ports 2222-2223 free\n")
    assert (only_run().state, only_run().reason) == (RunState.STOPPED, "terminated (SIGTERM)")
    assert "terminated (SIGTERM)" in tfctl_here("runs").out


def test_a_second_up_of_a_live_cluster_is_refused_with_how_to_stop_the_first(lab, tmp_path):
    store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    ran = tfctl_here("-f", "cluster.yaml", "up")
    run_id = cluster.record.run_id
    assert ran.code == 2
    assert ran.err.splitlines() == [
        f"error: run {run_id} of cluster 'fake' is still running (3 tasks: ps:0, worker:0, worker:1)",
        f"hint: stop it first: tfctl -f cluster.yaml down --run {run_id}",
    ]
    assert len(store.all()) == 1
    assert tfctl_here("down").code == 0


def test_up_says_why_its_backend_gave_it_nothing(lab):
    lab.refuse = "the pool is drained"
    ran = tfctl_here("up")
    assert (ran.code, ran.err) == (1, "error: the pool is drained\n")
    assert not RunStore().all()


def test_up_d_starts_here_leaves_the_run_to_its_watcher_and_prints_the_run_id(lab, monkeypatch):
    spawned: list[str] = []
    monkeypatch.setattr(watcher, "spawn_watcher", lambda store, record: spawned.append(record.run_id))
    ran = tfctl_here("up", "-d")
    assert ran.code == 0, ran.err
    record = only_run()
    assert ran.out == record.run_id + "\n" and spawned == [record.run_id]
    assert "detached. The run stops by itself when worker:0 finishes (a watcher process does it)." in ran.err
    assert "  tfctl status      tfctl logs -f      tfctl down\n" in ran.err
    assert record.state is RunState.RUNNING and record.lease_timeout == 0
    assert tfctl_here("down").code == 0


def fork_in_process(monkeypatch: pytest.MonkeyPatch, watch_log: io.StringIO) -> None:
    """`up -d`'s fork as a call: the watcher's body runs to the run's end in this process (its
    stdout, meant for watch.log, into `watch_log`), and the parent reads what it reported."""

    def fork_starter(body: Callable[[watcher.Report], None]) -> tuple[int, io.StringIO]:
        reported: list[str] = []
        with sigterm_kept(), contextlib.redirect_stdout(watch_log):
            body(lambda message: reported.append(json.dumps(message) + "\n"))
        return 0, io.StringIO("".join(reported))

    monkeypatch.setattr(watcher, "fork_starter", fork_starter)
    monkeypatch.setattr(watcher, "log_to_run_dir", lambda store, run_id: None)
    monkeypatch.setattr(os, "nice", lambda increment: 0)
    monkeypatch.setattr(type(watcher_backend()), "waiting_for", None)  # a backend that never waits: it forks


def watcher_backend() -> Any:
    from tfctl.backends.base import backend_for

    return backend_for("fake")


def test_up_d_of_a_backend_that_never_waits_relays_its_forked_watchers_progress(lab, monkeypatch):
    watch_log = io.StringIO()
    fork_in_process(monkeypatch, watch_log)
    ran = tfctl_here("up", "-d")
    assert ran.code == 0, ran.err
    record = only_run()
    assert ran.out == record.run_id + "\n"
    said = [line.split("] ", 1)[-1].strip() for line in ran.err.splitlines()]
    assert said[:2] == ["fake         leased pool gpus", f"run {record.run_id}: 3 tasks on 2 hosts"]  # acquired, then
    assert "h1           connecting" in said and "all 3 tasks running" in said
    assert watch_log.getvalue() == (
        "worker:0 finished successfully; 2 tasks had ended; 1 process stopped on 2 hosts; 0 remain; "
        "ports 2222-2223 free\n"
    )
    assert record.state is RunState.SUCCEEDED


def test_up_d_says_what_failed_its_forked_watchers_start(lab, monkeypatch):
    fork_in_process(monkeypatch, io.StringIO())
    lab.scripts["ps:0"] = TaskScript(exits_at_start=True)
    ran = tfctl_here("up", "-d")
    assert ran.code == 1
    assert ran.err.endswith("error: ps:0 could not start: No such file or directory\n")
    assert only_run().state is RunState.FAILED


def test_up_dry_run_prints_setup_tasks_and_devices_and_asks_nothing_of_anyone(lab, tmp_path):
    text = FAKE_FILE.replace("  worker: [h1:2223, h2:2222]\n", "  worker:\n    hosts: [h1:2223, h2:2222]\n")
    write(tmp_path, text + "    gpus: 1\n    cpus: 2\nsetup: [pip install -r requirements.txt]\n")
    ran = tfctl_here("up", "--dry-run")
    assert ran.code == 0, ran.err
    assert ran.err == "backend fake: the tests' in-process hosts\n"
    lines = ran.out.splitlines()
    assert lines[:2] == [
        "setup  once on each host (h1, h2), in its workdir, before any task",
        "  $ pip install -r requirements.txt",
    ]
    assert "worker:1  h2:2222" in lines and "  gpus:      CUDA_VISIBLE_DEVICES='0'" in lines
    assert "  cpus:      cores 0-1" in lines
    assert "  command:   train --job_name=worker --task_index=1" in lines
    assert not lab.journal.entries and not lab.leases and not RunStore().all()


def test_up_warns_of_task_addresses_anyone_can_reach(lab, tmp_path):
    write(tmp_path, FAKE_FILE.replace("h2:2222", "8.8.8.8:2222"))
    ran = tfctl_here("up", "--dry-run")
    assert ran.code == 0 and ran.err.startswith(
        "warning: TF servers are unauthenticated and listen on all interfaces; these task addresses are public: "
        "8.8.8.8:2222."
    )


# ---------------------------------------------------------------- status, logs, down


def test_status_shows_every_task_as_its_host_says_and_the_backends_own_state(lab, tmp_path):
    lab.scripts["worker:0"] = TaskScript(lines=["step 10", "step 20", OOM.replace("OOM", "later: OOM")])
    lab.scripts["worker:1"] = TaskScript()
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    run_id = cluster.record.run_id
    ran = tfctl_here("status")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert lines[0] == f"{run_id}  (running)  fake pool: leased"
    assert lines[1].split() == "TASK ADDRESS STATE PID EXIT UPTIME LISTEN STEP STEPS/S LAST LINE".split()
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert rows["ps:0"][1:3] == ["h1:2222", "running"] and rows["ps:0"][6] == "yes"
    assert rows["worker:0"][7] == "20"  # the step, from its progress lines

    answer = json.loads(tfctl_here("status", "--json").out)
    assert answer["run"]["id"] == run_id and answer["run"]["fake"] == {"pool": "gpus"}
    tasks = {t["task"]: t for t in answer["tasks"]}
    assert tasks["worker:1"]["state"] == "running" and tasks["worker:0"]["step"] == 20
    assert tasks["worker:0"]["diagnosis"]["kind"] == "oom"
    assert set(answer) == {"run", "tasks"}  # one object, as `status --help` says
    assert "per task" not in tfctl_here("status", "--help").out
    assert tfctl_here("down").code == 0


def test_logs_prints_each_tasks_lines_prefixed_filtered_and_refuses_a_file_for_a_task(lab, tmp_path):
    lab.scripts["worker:1"] = TaskScript(lines=["a", "b", "c"])
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    assert tfctl_here("logs").out.splitlines() == [
        "[ps:0]     ps: listening",
        "[worker:0] step 1",
        "[worker:0] step 2",
        "[worker:1] a",
        "[worker:1] b",
        "[worker:1] c",
    ]
    assert tfctl_here("logs", "--tail", "1", "worker").out.splitlines() == ["[worker:0] step 2", "[worker:1] c"]
    assert tfctl_here("logs", "--since", "1h", "worker:1").out.splitlines()[-1] == "[worker:1] c"
    stamped = tfctl_here("logs", "-t", "ps").out
    assert stamped.startswith("[ps:0]     20") and stamped.endswith("Z ps: listening\n")
    ran = tfctl_here("logs", "cluster.yaml")
    assert ran.code == 2 and "error: cluster.yaml is not a task: `-f` after `logs` means --follow" in ran.err
    ran = tfctl_here("logs", "chief")
    assert ran.code == 2 and "error: no task 'chief' in run" in ran.err
    assert "hint: choose from: ps, ps:0, worker, worker:0, worker:1" in ran.err
    assert tfctl_here("down").code == 0
    lab.hosts["h2"].down = True
    ran = tfctl_here("logs", "-f")  # the run is over: what is left, then the host it could not read
    assert ran.code == 1 and "[worker:0] step 2" in ran.out and "h2: connection refused" in ran.err


def test_down_stops_the_run_releases_its_backend_and_down_all_reaps_its_hosts(lab, tmp_path):
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    ran = tfctl_here("down", "--grace", "0")
    assert ran.code == 0, ran.err
    assert ran.err.splitlines() == [
        f"run {cluster.record.run_id}:",
        "3 processes stopped on 2 hosts; 0 remain; ports 2222-2223 free",
        "fake pool: released",
    ]
    record = only_run()
    assert (record.state, record.reason) == (RunState.STOPPED, "tfctl down")
    ran = tfctl_here("down", "--all")
    assert ran.code == 0
    assert ran.err.splitlines()[-2:] == [
        "h1: 0 orphaned processes stopped (runs: none); 0 remain",
        "h2: 0 orphaned processes stopped (runs: none); 0 remain",
    ]


def test_down_that_cannot_check_a_host_exits_1_naming_it(lab, tmp_path):
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    lab.hosts["h2"].down = True
    ran = tfctl_here("down")
    assert ran.code == 1 and "h2: could not be checked: h2: connection refused" in ran.err
    assert not only_run().left_nothing
    lab.hosts["h2"].down = False
    assert tfctl_here("down").code == 0 and only_run().left_nothing


def test_down_all_without_any_run_reaps_the_files_hosts(lab):
    lab.agent("h1")._reap = lambda request: p.ReapAnswer(2, 1, [4242], ["old-run"])
    ran = tfctl_here("down", "--all")
    assert ran.code == 1  # something remains on h1
    assert "h1: 2 orphaned processes stopped (runs: old-run); 1 remain" in ran.err.splitlines()
    ran = tfctl_here("down")
    assert (ran.code, ran.err.splitlines()[0]) == (2, "error: no run of cluster.yaml yet")


# ---------------------------------------------------------------- runs, check, export, init


def test_runs_lists_this_files_runs_and_prune_forgets_the_old_ones_here_and_on_their_hosts(lab, tmp_path):
    assert tfctl_here("up").code == 0
    assert tfctl_here("up").code == 0
    first, second = RunStore().all()
    head, *listed = tfctl_here("runs").out.splitlines()
    assert head.split() == ["RUN", "STARTED", "STATE", "REASON"]
    assert [line.split()[0] for line in listed] == [first.run_id, second.run_id]
    assert listed[0].split()[3:] == ["succeeded", "worker:0", "finished", "successfully"]
    assert [r["run_id"] for r in json.loads(tfctl_here("runs", "--all", "--json").out)] == [first.run_id, second.run_id]
    ran = tfctl_here("runs", "--keep", "1")
    assert ran.code == 2 and ran.err.startswith("error: --keep, --older-than and --dry-run go with --prune")

    ran = tfctl_here("runs", "--prune", "--keep", "1", "--dry-run")
    assert ran.out.splitlines() == [
        f"{first.run_id}  (succeeded, started {ran.out.split('started ')[1][:19]}): would remove 0 bytes",
        "  h1: nothing left there",
        "  h2: nothing left there",
    ]
    assert "(dry run: nothing was removed)" in ran.err and len(RunStore().all()) == 2
    assert [verb for _, verb, detail in lab.journal.entries if verb == "prune"] == ["prune", "prune"]
    ran = tfctl_here("runs", "--prune", "--keep", "1", "--json")
    report = json.loads(ran.out)
    assert [(r["run_id"], r["removed"]) for r in report["runs"]] == [(first.run_id, True)]
    assert [r.run_id for r in RunStore().all()] == [second.run_id]
    ran = tfctl_here("runs", "--prune", "--keep", "1")
    assert (
        ran.err == "nothing to prune: no runs beyond the newest 1 ended runs of their cluster file (1 runs, 0 live)\n"
    )
    assert json.loads(tfctl_here("runs", "--prune", "--json").out) == {"dry_run": False, "runs": [], "unreachable": {}}
    ran = tfctl_here("runs", "-f", "other.yaml")
    assert (ran.out, ran.err) == ("", "no runs of other.yaml (tfctl runs --all lists every run)\n")


def test_prune_says_what_it_removes_on_each_host_and_how_much(lab):
    assert tfctl_here("up").code == 0
    run_id = only_run().run_id
    lab.hosts["h1"]._prune = lambda request: p.PruneAnswer(
        {run_id: [f"~/.tfctl/runs/{run_id}", f"~/.tfctl/work/{run_id}"]}, {run_id: 1_234_567}, {}
    )
    lab.hosts["h2"]._prune = lambda request: p.PruneAnswer(
        {run_id: [f"~/.tfctl/runs/{run_id}"]}, {run_id: 2_500_000_000}, {}
    )
    ran = tfctl_here("runs", "--prune", "--keep", "0", "--dry-run")
    assert ran.out.splitlines()[0].endswith(": would remove 2.5 GB")
    assert ran.out.splitlines()[1:] == [
        f"  h1: ~/.tfctl/runs/{run_id}, ~/.tfctl/work/{run_id}",
        f"  h2: ~/.tfctl/runs/{run_id}",
    ]
    lab.hosts["h2"]._prune = lambda request: p.PruneAnswer({}, {}, {run_id: "worker:1 still runs"})
    ran = tfctl_here("runs", "--prune", "--keep", "0")
    assert ran.code == 1 and ran.out.splitlines()[0].endswith(": kept, h2: worker:1 still runs")
    assert "removed 0 of 1 runs beyond the newest 0 ended runs of their cluster file: 1.2 MB" in ran.err


def test_prune_keeps_a_run_whose_host_cannot_be_reached_and_says_how_to_finish(lab):
    assert tfctl_here("up").code == 0
    lab.hosts["h2"].down = True
    ran = tfctl_here("runs", "--prune", "--keep", "0", "--older-than", "1h")
    assert "nothing to prune" in ran.err and "ended over 1h ago" in ran.err  # it ended just now
    ran = tfctl_here("runs", "--prune", "--keep", "0")
    assert ran.code == 1
    assert ": kept, h2 could not be reached" in ran.out
    assert "error: h2 could not be reached: connection refused" in ran.err
    assert "hint: the 1 runs kept keep their records too" in ran.err
    assert len(RunStore().all()) == 1


def test_check_reports_each_host_and_the_network_and_fails_on_a_busy_port(lab):
    ran = tfctl_here("check")
    assert ran.code == 0, ran.err
    assert (
        ran.out.split()
        == "HOST HOSTNAME PYTHON TENSORFLOW h1 h1 3.11.7 tensorflow 2.21.0 h2 h2 3.11.7 tensorflow 2.21.0".split()
    )
    assert ran.err.endswith("reachability: 2 hosts -> h1:2222: all 2 connections ok\n")
    verbs = lab.journal.verbs("h1")
    assert verbs.index("listen") < verbs.index("probe") < verbs.index("stop")  # held, probed, let go
    assert "start" not in verbs and not RunStore().all()

    lab.agent("h2")._ports = lambda request: p.PortsAnswer(
        {str(port): p.PortInfo(True, [77], "sshd") for port in request.ports}
    )
    ran = tfctl_here("check", "--json")
    assert ran.code == 1
    found = json.loads(ran.out)
    assert [h["host"] for h in found["hosts"]] == ["h1", "h2"] and found["network"] is None
    assert found["busy_ports"]["h2:2222"]["pids"] == [77]
    ran = tfctl_here("check", "--no-network")
    assert ran.code == 1 and "port in use: h2:2222 (pid 77 sshd)" in ran.err


def test_export_tfjob_writes_the_cluster_as_a_tfjob(lab, tmp_path):
    write(tmp_path, extra="kubernetes: {image: registry/team/train:1.0}\n")
    ran = tfctl_here("export", "tfjob")
    assert ran.code == 0, ran.err
    assert "kind: TFJob" in ran.out and "image: registry/team/train:1.0" in ran.out
    assert set(("PS:", "Worker:")) <= {line.strip() for line in ran.out.splitlines()}
    ran = tfctl_here("-f", "cluster.yaml", "export", "tfjob", "-o", "job.yaml")
    assert (ran.code, ran.out, ran.err) == (0, "", "wrote job.yaml\n")
    assert (tmp_path / "job.yaml").read_text() == tfctl_here("export", "tfjob").out
    write(tmp_path)
    ran = tfctl_here("export", "tfjob")
    assert ran.code == 2 and "kubernetes.image" in ran.err


def test_init_writes_a_template_that_loads_and_refuses_a_cluster_file(lab, tmp_path):
    listed = tfctl_here("init", "--list").out.splitlines()
    assert [line.split()[0] for line in listed] == sorted(
        ["between-graph-async", "between-graph-sync", "multi-worker-mirrored", "parameter-server"]
    )
    ran = tfctl_here("init", "-t", "parameter-server", "proj")
    assert ran.code == 0, ran.err
    assert (tmp_path / "proj" / "cluster.yaml").is_file() and "wrote proj/cluster.yaml" in ran.err
    assert ran.err.endswith("next: cd proj && tfctl up        (edit cluster.yaml to add your hosts)\n")
    ran = tfctl_here("-f", "proj/cluster.yaml", "init")
    assert ran.code == 2 and "`init` writes cluster.yaml into a directory; it takes no cluster file" in ran.err
    assert "hint: tfctl init proj" in ran.err
    assert tfctl_here("init", "-t", "parameter-server", "proj").code != 0  # it would overwrite


def test_init_writes_a_new_directory_named_after_its_template_and_refuses_a_full_one(home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = tfctl_here("init")
    assert ran.code == 0, ran.err
    assert [p.name for p in tmp_path.iterdir()] == ["between-graph-async"]  # nothing lands here
    assert (tmp_path / "between-graph-async" / "train.py").is_file()
    assert ran.err.endswith("next: cd between-graph-async && tfctl up        (edit cluster.yaml to add your hosts)\n")
    (tmp_path / "parameter-server").mkdir()
    (tmp_path / "parameter-server" / "notes.txt").write_text("mine\n")
    ran = tfctl_here("init", "-t", "parameter-server")
    assert ran.code == 2 and ran.err.splitlines() == [
        "error: parameter-server already exists, and `init` writes a new directory named after the template",
        "hint: name another: tfctl init -t parameter-server DIRECTORY (`.` for this one), or pass --force to "
        "write into it",
    ]
    assert [p.name for p in (tmp_path / "parameter-server").iterdir()] == ["notes.txt"]
    (tmp_path / "between-graph-sync").write_text("mine\n")
    ran = tfctl_here("init", "-t", "between-graph-sync")
    assert ran.code == 2 and ran.err.startswith("error: between-graph-sync is a file, and `init` writes")
    (tmp_path / "multi-worker-mirrored").mkdir()  # an empty one is as good as new
    assert tfctl_here("init", "-t", "multi-worker-mirrored").code == 0
    assert tfctl_here("init", "-t", "parameter-server", ".").code == 0  # a directory named is written into
    assert (tmp_path / "cluster.yaml").is_file()


def test_the_runs_table_has_a_header_and_columns_as_wide_as_its_longest_id(home, tmp_path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: x\n")
    long_id = "a-much-longer-cluster-name-20260101-100000-0001"  # 47 characters: wider than 40
    for n, run_id in enumerate(["x-20260101-100000-0001", long_id]):
        add_run(home, run_id, cluster, 1_700_000_000 + n, {"worker": 1})
    ran = tfctl_here("runs", "-f", str(cluster))
    assert ran.code == 0, ran.err
    head, *lines = ran.out.splitlines()
    assert head.split() == ["RUN", "STARTED", "STATE", "REASON"]
    starts = {line.index("succeeded") for line in lines} | {head.index("STATE")}
    assert len(starts) == 1 and lines[1].startswith(long_id + "  ")  # one column, whatever the id's length


def test_errors_are_a_sentence_a_hint_and_an_exit_code(lab, tmp_path):
    ran = tfctl_here("status")
    assert (ran.code, ran.err.splitlines()[0]) == (2, "error: no run of cluster.yaml yet")
    (tmp_path / "cluster.yaml").unlink()
    ran = tfctl_here("status")
    assert ran.code == 2 and ran.err.splitlines() == [
        "error: no cluster.yaml in the current directory",
        "hint: pass -f FILE, or start a project with `tfctl init` (`tfctl init .` writes it here)",
    ]
    ran = tfctl_here("status", "--nonsense")
    assert ran.code == 2 and "Error: No such option '--nonsense'." in ran.err
    write(tmp_path)
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    ran = tfctl_here("exec", "worker:1", "--", "nvidia-smi")  # a fake host has nothing to exec on
    assert (ran.code, ran.err) == (1, "error: h2: a fake host has no transport; its agent is in-process\n")
    ran = tfctl_here("ssh", "worker:0")
    assert (ran.code, ran.err) == (1, "error: h1: a fake host has no transport; its agent is in-process\n")
    ran = tfctl_here("exec", "worker", "--", "true")
    assert ran.code == 2 and "job 'worker' has 2 tasks" in ran.err
    assert tfctl_here("down").code == 0


def completed(monkeypatch: pytest.MonkeyPatch, words: str) -> list[str]:
    """What tfctl offers bash for the last word of `words`."""
    monkeypatch.setenv("_TFCTL_COMPLETE", "bash_complete")
    monkeypatch.setenv("COMP_WORDS", words)
    monkeypatch.setenv("COMP_CWORD", str(len(words.split(" ")) - 1))
    ran = tfctl_here()
    assert (ran.code, ran.err) == (0, "")
    return [line.split(",", 1)[1] for line in ran.out.splitlines() if line.startswith("plain,")]


def test_completion_offers_this_runs_tasks_the_stores_run_ids_and_the_templates(lab, tmp_path, monkeypatch):
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    assert completed(monkeypatch, "tfctl logs ") == ["ps", "worker", "ps:0", "worker:0", "worker:1"]
    assert completed(monkeypatch, "tfctl logs worker:0 w") == ["worker", "worker:1"]
    assert completed(monkeypatch, "tfctl exec --run nosuch-run ") == []  # a problem completes nothing
    assert completed(monkeypatch, f"tfctl status --run {cluster.record.run_id[:6]}") == [cluster.record.run_id]
    assert completed(monkeypatch, "tfctl init -t multi") == ["multi-worker-mirrored"]
    assert completed(monkeypatch, "tfctl logs --file other.yaml ") == []  # no run of that file
    monkeypatch.delenv("_TFCTL_COMPLETE")
    assert tfctl_here("down").code == 0


def test_statuss_last_line_leaves_out_the_start_up_noise_that_logs_folds(lab, tmp_path):
    recorded = (Path(__file__).parent / "data" / "tf_logs" / "healthy_worker1.log").read_text().splitlines()
    start_up = [line for line in recorded if not line.startswith("#")]
    start_up = start_up[: next(i for i, line in enumerate(start_up) if "CoordinationService" in line) + 1]
    lab.scripts["worker:1"] = TaskScript(lines=start_up)  # its session just began: TF's MLIR, coordination lines
    _store, cluster = started(tmp_path / "cluster.yaml")
    cluster.close()
    (row,) = [line for line in tfctl_here("status").out.splitlines() if line.startswith("worker:1 ")]
    assert "CoordinationService" not in row and "master.cc:243] Scanning workers for devices" in row, row
    tasks = {t["task"]: t for t in json.loads(tfctl_here("status", "--json").out)["tasks"]}
    assert tasks["worker:1"]["last_line"].endswith("Scanning workers for devices: 2 total workers")


def test_status_and_runs_json_say_what_the_run_cost_as_its_hosts_counted(lab):
    lab.scripts["ps:0"].cpu_seconds = 36.0
    lab.scripts["worker:0"].cpu_seconds = 7200.0
    lab.scripts["worker:1"].cpu_seconds = 0.0
    assert tfctl_here("up").code == 0
    (run,) = json.loads(tfctl_here("runs", "--json").out)
    cost = run["accounting"]
    assert {name: task["cpu_hours"] for name, task in cost["tasks"].items()} == {
        "ps:0": 0.01,
        "worker:0": 2.0,
        "worker:1": 0.0,
    }
    assert cost["total"]["cpu_hours"] == 2.01 and cost["total"]["gpu_hours"] == 0.0
    assert cost["tasks"]["worker:1"]["wall_seconds"] <= cost["total"]["wall_seconds"] < 60
    assert json.loads(tfctl_here("status", "--json").out)["run"]["accounting"] == cost


def test_the_runs_result_is_its_final_evaluation_line_in_status_and_runs_json(lab):
    final = "final test accuracy 0.9721 after 600 global steps (2.0s, 303.2 steps/s)"
    lab.scripts["worker:0"].lines = ["step 599 worker 0 loss 0.0100 accuracy 1.0000", final]
    lab.scripts["worker:1"].lines = ["step 598 worker 1 loss 0.0200 accuracy 1.0000"]
    assert tfctl_here("up").code == 0
    want = {"accuracy": {"value": 0.9721, "step": 600, "task": "worker:0"}}
    (run,) = json.loads(tfctl_here("runs", "--json").out)
    assert run["result"] == want  # kept in the record when the run stopped
    assert json.loads(tfctl_here("status", "--json").out)["run"]["result"] == want
    assert "result: accuracy 0.9721 (step 600, worker:0)" in tfctl_here("status").out


SCANNING = "I0000 master.cc:243] Scanning workers for devices: 3 total workers"


def test_a_worker_silent_while_its_peer_printed_is_named_at_the_end_in_up_status_and_json(lab):
    """The Hogwild run of issue 33 with TF's defaults: worker 0 prints bare arrays and exits 0,
    worker 1 said nothing for 30 s after its session came up. The run succeeds; worker 1 is named."""
    lab.scripts["worker:0"] = TaskScript(end_after=3, lines=[f"[0.98{i % 10} 1.43{i % 7}]" for i in range(500)])
    lab.scripts["worker:1"] = TaskScript(lines=["I0000 grpc_server_lib.cc:467] Started server", SCANNING], quiet_for=30)
    ran = tfctl_here("up")
    assert ran.code == 0, ran.err
    said = f"worker:1: printed nothing for 30 s after `{SCANNING}` while worker:0 printed 500 lines: it never trained"
    assert said in ran.err and "set_verbosity" in ran.err and "replica_device_setter" in ran.err
    assert ran.err.index(said) < ran.err.index("job succeeded")
    assert said in tfctl_here("status").out.replace("\n  ", " ")
    tasks = {t["task"]: t for t in json.loads(tfctl_here("status", "--json").out)["tasks"]}
    assert tasks["worker:1"]["diagnosis"]["kind"] == "silent" and tasks["worker:1"]["diagnosis"]["peer"] == "worker:0"
    assert tasks["worker:0"]["diagnosis"] is None


CREATE_SESSION_WAIT = (
    "I0000 master.cc:281] CreateSession still waiting for response from worker: /job:worker/replica:0/task:0"
)


def test_a_silent_worker_is_noted_live_once_it_lasts_hang_timeout(lab, tmp_path):
    write(tmp_path, extra="hang_timeout: 1\n")
    lab.scripts["worker:0"] = TaskScript(end_after=4, lines=[f"[0.9{i % 10} 1.4]" for i in range(300)])
    lab.scripts["worker:1"] = TaskScript(lines=[SCANNING], quiet_for=30)
    ran = tfctl_here("up")
    assert ran.code == 0, ran.err
    note = f"note: worker:1 printed nothing for 30 s after `{SCANNING}` while worker:0 printed 300 lines"
    note += ": it is not training"
    assert note in ran.err and ran.err.count("note: worker:1 printed nothing") == 1
    assert ran.err.index(note) < ran.err.index("job succeeded")


def test_under_all_workers_the_silent_workers_hang_fails_the_run_with_its_silence_not_device_filters(lab, tmp_path):
    """Worker 0 trained and left; worker 1, silent all along, now waits for it at CreateSession
    (its session's retry): the run fails as hung, naming the silence."""
    write(tmp_path, extra="hang_timeout: 1\nsuccess_policy: all_workers\n")
    lab.scripts["worker:0"] = TaskScript(end_after=2, lines=[f"[0.9{i % 10} 1.4]" for i in range(300)])
    lab.scripts["worker:1"] = TaskScript(lines=[SCANNING, CREATE_SESSION_WAIT], quiet_for=30)
    ran = tfctl_here("up")
    assert ran.code == 1, ran.err
    reason = only_run().reason
    assert reason.startswith("worker:1 has been stuck for over 1s: worker:1 printed nothing for 30 s after"), reason
    assert "it never trained" in reason and "set_verbosity" in reason and "device_filters" not in reason
