"""Two runs of two cluster files without ports on the same simulated ssh hosts, side by side: each
host's supervisor picks every task's port, and each task reaches the peers its TF_CONFIG names.

Hosts are network namespaces with their own sshd (bench/netns_hosts.py), as in test_ssh_cluster.
"""

from __future__ import annotations

import json
import os
import threading
from functools import partial
from pathlib import Path

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests import test_ssh_cluster as ssh_cluster
from tests.conftest import tfctl
from tfctl.supervisor.procfs import proc_env_markers

pytestmark = pytest.mark.netns
TASK = "{python} fake_task.py --name {job_name}{task_index} --port -1 --connect-peers 30"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_netns()
    with TestHostLab(
        2, workdir=tmp_path_factory.mktemp("netns-lab-ports"), prefix="tfctl-cp", bridge="tfctlbr50", subnet="10.77.50"
    ) as lab:
        yield lab


def write_cluster(directory: Path, lab, name: str) -> Path:
    """ps on tfh0, worker 0 beside it and worker 1 on tfh1: no port anywhere."""
    directory.mkdir(parents=True)
    jobs = f'''  ps:
    hosts: [tfh0]
    command: "{TASK} --sleep -1"
  worker: [tfh0, tfh1]'''
    return ssh_cluster.write_cluster(directory, lab, jobs, f"{TASK} --sleep 8", name=name)


def statuses(cluster: Path, home: Path) -> list[dict]:
    return json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]


def test_two_runs_without_ports_on_the_same_hosts_train_side_by_side(tmp_path, home, lab):
    clusters = [write_cluster(tmp_path / name, lab, name) for name in ("alpha", "beta")]
    ups: dict[Path, object] = {}

    def up(cluster: Path) -> None:
        ups[cluster] = tfctl("-f", str(cluster), "up", "-d", home=home)

    threads = [threading.Thread(target=up, args=(cluster,)) for cluster in clusters]  # both at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs = {}
    try:
        for cluster in clusters:
            ran = ups[cluster]
            assert ran.returncode == 0, ran.stderr  # type: ignore[attr-defined]
            assert "picked free port" in ran.stderr  # type: ignore[attr-defined]
            runs[cluster] = ran.stdout.strip()  # type: ignore[attr-defined]
        # Both runs' tasks run and listen at once, each on a port its host picked.
        tasks = {cluster: statuses(cluster, home) for cluster in clusters}
        addresses = [f"{t['host']}:{t['port']}" for cluster in clusters for t in tasks[cluster]]
        assert all(t["state"] == "running" for cluster in clusters for t in tasks[cluster]), tasks
        assert len(set(addresses)) == 6 and all(t["port"] for c in clusters for t in tasks[c])  # 0: not picked
        for cluster in clusters:
            wait_until(
                partial(statuses, cluster, home),
                30,
                f"both workers of {cluster.parent.name} done",
                # worker:0 (the chief) succeeds; worker:1 succeeds too, or is stopped with the run
                # if it started later on a loaded machine and worker:0 ended the job first
                until=lambda found: (
                    all(t["state"] in ("succeeded", "stopped") for t in found if t["task"] != "ps:0")
                    and next(t["state"] for t in found if t["task"] == "worker:0") == "succeeded"
                ),
                interval=0.5,
            )
            logs = tfctl("-f", str(cluster), "logs", home=home).stdout
            for task in ("ps0", "worker0", "worker1"):  # each reached the 2 others its TF_CONFIG names
                assert f"{task} connected to 2 peers" in logs, logs
            ports = {t["task"]: f"{t['host']}:{t['port']}" for t in statuses(cluster, home)}
            (line,) = [line for line in logs.splitlines() if "worker1 connected to" in line]
            assert ports["ps:0"] in line and ports["worker:0"] in line
    finally:
        for cluster in clusters:
            down = tfctl("-f", str(cluster), "down", home=home)
            assert down.returncode == 0, down.stderr
    for run_id in runs.values():
        assert ssh_cluster.run_pids(lab, run_id) == {}
    for host in lab.hosts:  # nothing of either run, nor a port holder, on any host
        left = [p for p in host.pids() if proc_env_markers(p)[0]]
        for pid in left:
            os.kill(pid, 9)
        assert left == []
