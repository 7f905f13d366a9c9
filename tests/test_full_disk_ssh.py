"""A full disk on one simulated SSH host: a 2 MiB tmpfs over its ~/.tfctl/hosts, filled while
its task runs. The monitor lives on, `status` names the host and the full disk, `down` stops
the task (proved by PID), and the task's end is written once space returns."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench.netns_hosts import TestHost, make_lab_fixture
from bench.waiting import wait_until
from tests.conftest import tfctl
from tests.test_ssh_cluster import run_pids, write_cluster

pytestmark = pytest.mark.netns
lab = make_lab_fixture(2, scope="module", prefix="tfctl-d", bridge="tfctlbr22", subnet="10.77.22")
JOBS = "  worker: [tfh0:2222, tfh1:2222]"
QUIET = "{python} fake_task.py --name w{task_index} --port 2222 --lines 0 --sleep -1"  # writes once, then sleeps


def monitors(host: TestHost, run_id: str) -> list[int]:
    """The run's monitors on `host` (root-namespace pids): processes holding its task files open."""
    found = []
    for pid in host.pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if f"/tasks/{run_id}/" in target and target.endswith("output.log") and pid not in found:
                found.append(pid)
    return [p for p in found if open(f"/proc/{p}/comm").read().startswith("tfctl")]


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_a_full_disk_on_one_host_is_reported_and_survived(tmp_path: Path, home: Path, lab) -> None:
    host = lab.host("tfh1")
    hosts_dir = f"{host.home}/.tfctl/hosts"
    filler = f"{hosts_dir}/filler"
    os.makedirs(hosts_dir, exist_ok=True)
    host.exec(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", hosts_dir], check=True)
    cluster = write_cluster(tmp_path, lab, JOBS, QUIET)
    run_id = ""
    try:
        up = tfctl("-f", str(cluster), "up", "-d", home=home)
        assert up.returncode == 0, up.stderr
        run_id = up.stdout.strip()
        tasks = run_pids(lab, run_id)["tfh1"]
        watching = monitors(host, run_id)
        assert len(watching) == 1, watching
        filled = host.exec(["sh", "-c", f"cat /dev/zero > {filler}"])
        assert "No space left on device" in filled.stderr, filled

        shown = tfctl("-f", str(cluster), "status", home=home, timeout=60)
        row = next(line for line in shown.stdout.splitlines() if line.startswith("worker:1"))
        assert re.search(r"running, disk full under ~/\.tfctl", row), shown.stdout
        assert "tfh1: disk full under ~/.tfctl (No space left on device)" in shown.stdout, shown.stdout
        state = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, timeout=60).stdout)
        assert list(state["run"]["host_problems"]) == ["tfh1"], state

        down = tfctl("-f", str(cluster), "down", home=home, timeout=120)
        assert down.returncode == 0, down.stderr
        assert alive(tasks) == [] and run_pids(lab, run_id) == {}
        assert alive(watching) == watching  # holding the stop it cannot write yet
        exit_record = f"{hosts_dir}/*/tasks/{run_id}/worker-1/exit.json"
        assert host.exec(["sh", "-c", f"cat {exit_record}"]).returncode != 0

        host.exec(["rm", filler], check=True)
        wait_until(lambda: alive(watching) == [], 15, "the monitor to write the end and go", interval=0.2)
        ended = json.loads(host.exec(["sh", "-c", f"cat {exit_record}"], check=True).stdout)
        assert ended["signal"] == 15, ended
        stop_record = host.exec(["sh", "-c", f"cat {hosts_dir}/*/tasks/{run_id}/worker-1/stop.json"], check=True)
        assert json.loads(stop_record.stdout)["requested_at"] <= ended["ended_at"]
    finally:
        host.exec(["rm", "-f", filler])
        if run_id:
            tfctl("down", "--run", run_id, home=home, timeout=120)
        for pid in monitors(host, run_id) if run_id else []:
            os.kill(pid, 9)
        if host.exec(["umount", hosts_dir]).returncode != 0:
            host.exec(["umount", "-l", hosts_dir])
