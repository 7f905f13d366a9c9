"""Runs whose hosts' files were tampered with or grew big: `status` says what it knows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fake, free_ports, tfctl, wait_until
from tests.fake_runs import FAKE_FILE, in_thread, started, tfctl_here, write
from tests.fakes import TaskScript
from tfctl.controller.live import driver
from tfctl.controller.live import rpc as live
from tfctl.supervisor.protocol import Usage


def test_a_task_whose_folder_on_its_host_was_deleted_is_lost_saying_why(tmp_path: Path, home: Path) -> None:
    (port,) = free_ports(1)
    cluster = tmp_path / "cluster.yaml"
    command = fake(f"--name w --port {port} --sleep -1")
    cluster.write_text(f"name: gone\njobs:\n  worker:\n    hosts: [localhost:{port}]\n    command: '{command}'\n")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    try:
        (folder,) = home.glob(f"hosts/*/tasks/{run_id}")
        shutil.rmtree(folder)  # while the task runs
        shown = tfctl("-f", str(cluster), "status", home=home)
        assert shown.returncode == 0 and "lost" in shown.stdout and "pending" not in shown.stdout, shown.stdout
        assert "worker:0 was lost: no trace of it on localhost (its folder there was deleted" in shown.stdout
        (task,) = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        assert task["state"] == "lost"
    finally:
        assert tfctl("-f", str(cluster), "down", home=home).returncode == 0


def test_top_and_status_json_of_100_tasks_with_two_minutes_of_history_come_through_the_door(
    fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake backend's hosts answer each task's usage samples as the supervisor's monitors
    # record them (one every 3 s: two minutes is 40), through the real wire and the real door;
    # 100 real processes for two minutes would cost the suite more than the bound is worth.
    monkeypatch.chdir(tmp_path)
    workers = [f"h{1 + i % 2}:{3000 + i // 2}" for i in range(99)]
    write(tmp_path, FAKE_FILE.replace("[h1:2223, h2:2222]", f"[{', '.join(workers)}]"))
    history = [Usage(1000.0 + 3 * i, 50.0 + i % 7, (900 + i) << 20) for i in range(40)]
    names = ["ps:0", *(f"worker:{i}" for i in range(99))]
    fake_backend.scripts.update({name: TaskScript(lines=["step 1"], usage=history) for name in names})
    answered: list[bool] = []
    real_ask = live.ask

    def ask(*args: Any) -> Any:
        answer = real_ask(*args)
        answered.append(answer is not None)
        return answer

    monkeypatch.setattr(live, "ask", ask)
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)
    with cluster, in_thread(lambda: driver.attach(store, cluster, lambda _lines: None)) as ended:
        wait_until(live.socket_path(store.run_dir(cluster.record.run_id)).exists, 10, "the door to open")
        top = tfctl_here("top", "--once")
        assert top.code == 0, top.err
        assert sorted(line.split()[0] for line in top.out.splitlines()[2:102]) == sorted(names)
        status = tfctl_here("status", "--json")
        assert status.code == 0 and len(json.loads(status.out)["tasks"]) == 100
        assert tfctl_here("down", "--grace", "0").code == 0
    assert answered == [True, True, True], ended  # top, status, down: through the attached up's door


def test_logs_of_long_lines_through_the_door_come_in_parts_below_the_answer_bound(
    fake_backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    lines = [f"{i} " + "x" * 100_000 for i in range(200)]  # 20 MB, in lines longer than logs shows whole
    fake_backend.scripts.update({"ps:0": TaskScript(), "worker:0": TaskScript(lines=lines), "worker:1": TaskScript()})
    store, cluster = started(tmp_path / "cluster.yaml", attached=True)
    with cluster, in_thread(lambda: driver.attach(store, cluster, lambda _lines: None)):
        wait_until(live.socket_path(store.run_dir(cluster.record.run_id)).exists, 10, "the door to open")
        shown = tfctl_here("logs", "worker:0")
        assert tfctl_here("down", "--grace", "0").code == 0
    assert shown.code == 0, shown.err
    assert "".join(line.removeprefix("[worker:0] ") for line in shown.out.splitlines()) == "".join(lines)


def test_a_start_whose_watcher_is_killed_ends_failed_with_nothing_left(tmp_path: Path, home: Path) -> None:
    (port,) = free_ports(1)
    cluster = tmp_path / "cluster.yaml"
    command = fake(f"--name w --port {port} --sleep -1")
    cluster.write_text(f"name: cut\njobs:\n  worker:\n    hosts: [localhost:{port}]\n    command: '{command}'\n")
    up = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "up", "-d"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    children = Path(f"/proc/{up.pid}/task/{up.pid}/children")
    forked = wait_until(lambda: children.read_text().split(), 30, "up -d to fork its watcher", interval=0.001)
    os.kill(int(forked[0]), signal.SIGKILL)  # long before it could say how the start went
    _out, err = up.communicate(timeout=60)
    assert up.returncode == 1 and "died during the start: what it started is stopped" in err, err
    (record,) = json.loads(tfctl("runs", "--all", "--json", home=home).stdout)
    assert record["state"] == "failed" and record["reason"].endswith("died during the start")
    shown = tfctl("-f", str(cluster), "status", "--json", home=home)
    assert all(t["state"] != "running" for t in json.loads(shown.stdout)["tasks"]), shown.stdout
