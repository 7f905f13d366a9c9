"""The Python API end to end on a localhost cluster of small Python tasks: start detached (no
fork of the caller), follow the logs, read status, wait, down from another thread, attached off
the main thread, and every error path raising its exception."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import pytest

import tfctl
from tests.conftest import fake, free_ports


def write_cluster(dirpath: Path, ps: str, worker: str, name: str = "api") -> Path:
    ports = free_ports(2)
    path = dirpath / "cluster.yaml"
    path.write_text(f"""name: {name}
grace_period: 2
startup_timeout: 20
jobs:
  ps:
    hosts: [localhost:{ports[0]}]
    command: "{ps.replace("PORT", str(ports[0]))}"
  worker:
    hosts: [localhost:{ports[1]}]
    command: "{worker.replace("PORT", str(ports[1]))}"
""")
    return path


def forbid_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller (a notebook kernel, a threaded program) is never forked by the API."""

    def no_fork() -> int:
        raise AssertionError("the API forked its caller")

    monkeypatch.setattr(os, "fork", no_fork)


def test_a_detached_run_read_through_its_handle_to_its_end(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_fork(monkeypatch)
    cluster = write_cluster(
        tmp_path,
        fake("--name ps --port PORT --sleep -1"),
        fake("--name w --port PORT --steps-per-sec 20 --steps-for 1.5 --sleep 2"),
    )
    events: list[tfctl.Event] = []
    run = tfctl.up(cluster, progress=events.append)
    assert isinstance(run, tfctl.Run) and run.home == home
    assert any(e.kind is tfctl.EventKind.PROGRESS and "listening" in e.text for e in events), events

    first_step = next(line for line in run.logs(follow=True, tasks=["worker"]) if line.text.startswith("step "))
    assert first_step.task == "worker:0"

    status = run.status()
    assert status.id == run.id and status.state is tfctl.RunState.RUNNING
    assert {t.name: t.state for t in status.tasks}["ps:0"] is tfctl.TaskState.RUNNING
    assert status.task("ps:0").listening and status.data["run"]["id"] == run.id

    again = pickle.loads(pickle.dumps(run))  # a sweep library's worker process waits on it so
    ended = again.wait(timeout=60)
    assert ended.succeeded and ended.state is tfctl.RunState.SUCCEEDED, ended
    lines = list(run.logs(tasks=["worker:0"]))
    assert [line.text for line in lines if line.text.startswith("w done")] == ["w done, exit 0"]
    assert [r.id for r in tfctl.list_runs(cluster)] == [run.id]
    assert tfctl.run(run.id).wait().state is tfctl.RunState.SUCCEEDED


def test_a_failed_run_s_wait_names_the_task_and_the_diagnosis_status_shows(tmp_path: Path, home: Path) -> None:
    (tmp_path / "diverge.py").write_text(
        "import time\nprint('step 10 loss nan', flush=True)\ntime.sleep(0.3)\n"
        "print('ERROR:tensorflow:Model diverged with loss = NaN.', flush=True)\nraise SystemExit(3)\n"
    )
    cluster = write_cluster(tmp_path, fake("--name ps --port PORT --sleep -1"), "{python} diverge.py")
    run = tfctl.up(cluster)
    ended = run.wait(timeout=60)
    assert ended.state is tfctl.RunState.FAILED and not ended.succeeded
    assert ended.task == "worker:0" and "worker:0" in (ended.reason or ""), ended
    status = run.status()
    assert status.task("worker:0").exit_code == 3 and status.task("worker:0").state is tfctl.TaskState.FAILED
    assert ended.diagnosis is not None and ended.diagnosis == status.task("worker:0").diagnosis
    assert "NaN" in ended.diagnosis["cause"] or "diverged" in ended.diagnosis["cause"], ended.diagnosis


def test_down_from_another_thread_ends_a_blocked_wait(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(tmp_path, fake("--name ps --port PORT --sleep -1"), fake("--name w --port PORT --sleep -1"))
    run = tfctl.up(cluster, accept_new_host_keys=True)  # (the watcher takes the flag too)
    waited: list[tfctl.Ended] = []
    waiter = threading.Thread(target=lambda: waited.append(run.wait(timeout=60)))
    waiter.start()
    stopped = run.down()
    waiter.join(60)
    assert stopped.clean and stopped.processes >= 2 and stopped.released is None, stopped
    assert waited and waited[0].state is tfctl.RunState.STOPPED, waited


def test_an_attached_up_off_the_main_thread_hears_every_line(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(
        tmp_path, fake("--name ps --port PORT --sleep -1"), fake("--name w --port PORT --lines 3 --sleep 0.3")
    )
    events: list[tfctl.Event] = []
    result: list[object] = []

    def attached() -> None:
        try:
            result.append(tfctl.up(cluster, detach=False, progress=events.append))
        except BaseException as e:  # noqa: BLE001 - the test reads it below
            result.append(e)

    thread = threading.Thread(target=attached)
    thread.start()
    thread.join(60)
    assert result and isinstance(result[0], tfctl.Run), result
    lines = [(e.source, e.text) for e in events if e.kind is tfctl.EventKind.LINE]
    assert [text for task, text in lines if task == "worker:0" and " line " in text] == [
        "w line 0",
        "w line 1",
        "w line 2",
    ]
    assert result[0].wait(timeout=1).succeeded


def test_error_paths_raise_their_exception(tmp_path: Path, home: Path) -> None:
    with pytest.raises(tfctl.UsageError, match="no-such-run"):
        tfctl.run("no-such-run")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\njobs: {worker: {hosts: [localhost:1], command: 3, colour: red}}\n")
    with pytest.raises(tfctl.ConfigError) as problem:
        tfctl.up(bad)
    assert str(bad) in problem.value.message
    cluster = write_cluster(tmp_path, fake("--name ps --port PORT --sleep -1"), fake("--name w --port PORT --sleep -1"))
    run = tfctl.up(tfctl.load_cluster(cluster))  # a parsed file counts as that file
    try:
        with pytest.raises(tfctl.UsageError, match="still running"):
            tfctl.up(cluster)
        with pytest.raises(tfctl.Timeout, match="still running"):
            run.wait(timeout=0)
        with pytest.raises(tfctl.UsageError, match="no task"):
            next(run.logs(tasks=["chief"]))
    finally:
        assert run.down().clean
    with pytest.raises(tfctl.UsageError, match=f"{run.id}x"):
        tfctl.up(cluster, resume=run.id + "x")
    (tmp_path / "dead").mkdir()
    dead_ps = write_cluster(tmp_path / "dead", fake("--name ps --exit 2"), fake("--name w --port PORT --sleep -1"))
    with pytest.raises(tfctl.StartupError, match="ps:0"):  # the watcher's error, as the class it was
        tfctl.up(dead_ps)
    assert [r.state for r in tfctl.list_runs(dead_ps)] in ([], [tfctl.RunState.FAILED])


def test_a_search_loop_of_four_trials_through_params(tmp_path: Path, home: Path) -> None:
    """An Optuna-style loop without Optuna: each trial a run with its own `lr`, its accuracy read
    back from the run's result; the best one is the one the made-up objective favours."""
    (tmp_path / "trial.py").write_text(
        "import sys\nlr = float(sys.argv[1])\n"
        "print(f'final test accuracy {1 - abs(lr - 0.1):.4f} after 10 global steps', flush=True)\n"
    )
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: search\nparams: {lr: 0.5}\ngrace_period: 2\n"
        'command: "{python} trial.py {params.lr}"\njobs:\n  worker: [localhost]\n'
    )
    scores = {}
    for lr in (0.3, 0.1, 0.01, 0.2):
        run = tfctl.up(cluster, params={"lr": lr})
        ended = run.wait(timeout=60)
        assert ended.succeeded, ended
        scores[lr] = ended.result["accuracy"].value
        assert run.status().data["run"]["params"] == {"lr": lr}
    assert max(scores, key=scores.__getitem__) == 0.1 and scores[0.1] == 1.0
    assert [r.id for r in tfctl.list_runs(cluster)] and len(tfctl.list_runs(cluster)) == 4
