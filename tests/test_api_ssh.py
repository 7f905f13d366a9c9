"""The Python API on the suite's simulated SSH hosts (network namespaces with their own sshd,
bench/netns_hosts.py), sharing one home: a detached run started, read and waited on from Python, and a run stopped
from another thread while a wait blocks; nothing of either left on a host."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import tfctl
from bench.netns_hosts import make_lab_fixture
from tests import test_ssh_cluster as ssh_cluster
from tfctl.supervisor.procfs import proc_env_markers

pytestmark = pytest.mark.netns
TASK = "{python} fake_task.py --name {job_name}{task_index} --port -1"


# Hosts sharing one home, as with NFS: the hosts' ~/.tfctl is one directory (the API's watcher,
# a process of its own, meets what a forked one does).
lab = make_lab_fixture(2, scope="module", prefix="tfctl-api", bridge="tfctlbr61", subnet="10.77.61", shared_home=True)


def write_cluster(directory: Path, lab, worker: str) -> Path:
    """ps on tfh0, a worker on each host, ports picked by the hosts."""
    directory.mkdir(parents=True)
    jobs = f'''  ps:
    hosts: [tfh0]
    command: "{TASK} --sleep -1"
  worker: [tfh0, tfh1]'''
    return ssh_cluster.write_cluster(directory, lab, jobs, f"{TASK} {worker}", name="api")


def left_on_hosts(lab, run_id: str) -> dict[str, list[int]]:
    return ssh_cluster.run_pids(lab, run_id)


def test_a_run_on_ssh_hosts_from_python(tmp_path: Path, home: Path, lab) -> None:
    cluster = write_cluster(tmp_path / "done", lab, "--steps-per-sec 20 --steps-for 1 --sleep 1.5 && {python} final.py")
    (tmp_path / "done" / "work" / "final.py").write_text(  # (the workdir is synced to the hosts at `up`)
        "print('final test accuracy 0.9500 after 20 global steps', flush=True)\n"
    )
    run = tfctl.up(cluster)
    try:
        first = next(line for line in run.logs(follow=True, tasks=["worker:1"]) if line.text.startswith("step "))
        assert first.task == "worker:1"
        status = run.status()
        assert {t.name: t.host for t in status.tasks} == {"ps:0": "tfh0", "worker:0": "tfh0", "worker:1": "tfh1"}
        assert status.task("ps:0").state is tfctl.TaskState.RUNNING and status.task("ps:0").listening
        ended = run.wait(timeout=60)
        assert ended.succeeded, ended
        assert [line.text for line in run.logs(tasks=["worker:1"]) if "done" in line.text] == ["worker1 done, exit 0"]
        metrics = run.metrics()
        assert metrics.result["accuracy"].value == 0.95 and metrics.result["accuracy"].step == 20
        assert len(metrics.task("worker:0").steps) >= 5  # the step lines the report reads
    finally:
        run.down()
    assert left_on_hosts(lab, run.id) == {}


def test_down_from_another_thread_stops_a_run_on_ssh_hosts(tmp_path: Path, home: Path, lab) -> None:
    cluster = write_cluster(tmp_path / "stopped", lab, "--sleep -1")
    run = tfctl.up(cluster)
    waited: list[tfctl.Ended] = []
    waiter = threading.Thread(target=lambda: waited.append(run.wait(timeout=60)))
    waiter.start()
    stopped = run.down()
    waiter.join(60)
    assert stopped.clean and stopped.hosts == 2 and stopped.processes >= 3, stopped
    assert waited and waited[0].state is tfctl.RunState.STOPPED
    assert left_on_hosts(lab, run.id) == {}
    for host in lab.hosts:  # nothing of the run, nor a port holder, on any host
        assert [p for p in host.pids() if proc_env_markers(p)[0]] == []
