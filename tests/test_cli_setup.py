"""`setup:` on localhost through the real CLI: run once per host in the workdir before any task,
shown live, and a failure (or Ctrl-C) stops `up` before any task starts, leaving nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.waiting import wait_until
from tests.conftest import fake, free_ports, marked_processes, spawn_tfctl, tfctl, wait_for_line


def write_cluster(tmp_path: Path, setup: list[str]) -> Path:
    """One worker that records what it sees: the setup's file, and the setup's exported variable."""
    work = tmp_path / "project"
    work.mkdir()
    port = free_ports(1)[0]
    items = "".join(f"  - {json.dumps(c)}\n" for c in setup)
    task = fake("--name w --lines 1") + ' && cat made-by-setup && echo "SETUP_VAR=[$SETUP_VAR]"'
    path = work / "cluster.yaml"
    path.write_text(
        f"name: s\ngrace_period: 1\nsetup:\n{items}command: '{task}'\njobs:\n  worker: [localhost:{port}]\n"
    )
    return path


def run_processes(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


def last_run(home: Path, cluster: Path) -> dict:
    return json.loads(tfctl("runs", "-f", str(cluster), "--json", home=home).stdout)[-1]


def test_setup_runs_in_the_workdir_in_one_shell_before_the_tasks(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(
        tmp_path,
        [
            "pwd",
            "cd sub 2>/dev/null || mkdir sub",
            "export SETUP_VAR=kept-in-setup",
            'echo "var: $SETUP_VAR" >&2',
            "echo made > made-by-setup",
        ],
    )
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    err = up.stderr.splitlines()
    shown = [line.split("localhost", 1)[1].strip() for line in err if "] localhost " in line]
    assert shown[2:] == [
        "setup: 5 commands in " + str(cluster.parent),
        "$ pwd",
        str(cluster.parent),
        "$ cd sub 2>/dev/null || mkdir sub",
        "$ export SETUP_VAR=kept-in-setup",
        '$ echo "var: $SETUP_VAR" >&2',
        "var: kept-in-setup",  # one shell: what a command exports, the next one sees (stderr too)
        "$ echo made > made-by-setup",
        "setup done",
    ]
    assert err.index(next(line for line in err if "setup done" in line)) < err.index(
        next(line for line in err if "worker:0     starting" in line)
    )
    # The task ran after setup, in the workdir: it found the file; the variable stayed in setup.
    assert "[worker:0] made" in up.stdout and "[worker:0] SETUP_VAR=[]" in up.stdout
    assert (cluster.parent / "sub").is_dir() and not (cluster.parent / "sub" / "made-by-setup").exists()


def test_a_failing_command_stops_up_before_any_task(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(
        tmp_path,
        [
            "echo preparing",
            "sh -c 'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo pip line $i; done; exit 3'",
            "echo never",
        ],
    )
    began = time.monotonic()
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 1
    assert time.monotonic() - began < 20
    assert "error: setup failed on localhost: `sh -c 'for i in" in up.stderr and "exited with code 3" in up.stderr
    assert "last 10 lines:\n    pip line 3\n" in up.stderr and "    pip line 12\n" in up.stderr
    assert "$ echo never" not in up.stderr and "never" not in up.stderr.replace("$ echo never", "")
    assert "worker:0     starting" not in up.stderr and up.stdout == ""
    run = last_run(home, cluster)
    assert run["state"] == "failed" and run["reason"].startswith("setup failed on localhost: `sh -c")
    assert run_processes(run["run_id"]) == []
    assert not (cluster.parent / "made-by-setup").exists()


@pytest.mark.parametrize("detach", [False, True], ids=["attached", "detached"])
def test_ctrl_c_during_setup_stops_it_and_starts_nothing(tmp_path: Path, home: Path, detach: bool) -> None:
    """Detached, `up -d` leaves the start to the watcher it forked and prints its progress;
    Ctrl-C there still stops everything started, and the watcher ends too."""
    from tfctl.controller.live.watcher import is_running
    from tfctl.runs.store import RunStore

    cluster = write_cluster(tmp_path, ["echo waiting", "sleep 60"])
    up = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "up", *(["-d"] if detach else []), "-f", str(cluster)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    try:
        assert up.stderr is not None
        wait_for_line(up.stderr, "$ sleep 60", 20)
        run_id = last_run(home, cluster)["run_id"]
        controller = RunStore(home).load(run_id).watcher
        assert controller is not None and (controller.pid != up.pid) is detach
        assert controller.attached is not detach
        assert len(run_processes(run_id)) >= 1  # the setup shell's sleep
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=30)
    finally:
        up.kill()
        up.wait()
    assert up.returncode == 130, err
    assert "stopping what was started" in err and "interrupted: everything started has been stopped" in err
    assert run_processes(run_id) == [] and out == ""
    assert last_run(home, cluster)["state"] == "stopped"
    wait_until(lambda: not is_running(controller), 10, "the watcher's exit")


def test_dry_run_lists_setup_and_the_warnings_up_would_print(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "name: d\nsetup: [make deps, 'pip install -r requirements.txt']\ncommand: python train.py\n"
        "jobs:\n  worker: [localhost:2223, 8.8.8.8:2224]\n"
    )
    dry = tfctl("-f", str(cluster), "up", "--dry-run", home=home)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith(
        "setup  once on each host (8.8.8.8, localhost), in its workdir, before any task\n"
        "  $ make deps\n  $ pip install -r requirements.txt\nworker:0  localhost:2223\n"
    )
    assert "warning: TF servers are unauthenticated" in dry.stderr and "8.8.8.8:2224" in dry.stderr
    assert not (home / "runs").exists()


def test_a_second_up_is_refused_while_the_first_is_in_setup(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(tmp_path, ["sleep 60"])
    first = spawn_tfctl("up", "-f", str(cluster), home=home, stdout=subprocess.DEVNULL)
    try:
        assert first.stderr is not None
        wait_for_line(first.stderr, "$ sleep 60", 20)
        second = tfctl("-f", str(cluster), "up", home=home)
        assert second.returncode == 2
        assert f"is starting (syncing, setup or starting tasks; its `tfctl up` is pid {first.pid})" in second.stderr
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 130
    assert run_processes(last_run(home, cluster)["run_id"]) == []
