"""The fault series with every task in a podman container (docker in some cases): SIGKILL in
turn the task's monitor, the host supervisor, every tfctl process of a host, the attached `up`
and the watcher of `up -d`, on localhost and on simulated SSH hosts, each host with its own
podman (and dockerd); and a host frozen, then thawed (bench/container_freeze.py has the longer
series). After each, no container of the run is left (asked of each host's runtime, by the run's
label) and no process of it either (by PID: its tasks and tethers by their markers, its runtime
clients and conmons by the containers' names), and `down` finds nothing to stop. A killed
attached `up` has its containers stopped by the lease running out on the hosts.
The parameter-server template trains in containers on the SSH hosts, for the real thing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from bench.containers_lab import IMAGE, HostDockerLab, HostPodmanLab, Lab, freeze, run_processes, skip_reason, thaw
from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, free_ports, spawn_tfctl, tfctl, wait_for_line
from tests.test_containers import boxed_tf
from tests.test_templates import check_common, copy_template, run_up
from tfctl.runs.store import RunStore
from tfctl.supervisor import containers
from tfctl.supervisor.procfs import live_pids, proc_cmdline, proc_env_markers, proc_stat

ALONE_WITHIN = 40.0  # seconds from the fault until nothing of the run is left anywhere
FROZEN_FOR = 5  # host_timeout of a run whose host freezes


@dataclass
class Hosts:
    """Where the run's tasks go: the ps's and the workers' `host:port`, each host's runtime, and
    the root-namespace pids of a host's tfctl processes (its supervisors and task monitors)."""

    ps: str
    workers: list[str]
    runtimes: dict[str, Lab]  # host -> its container runtime
    tfctl_pids: Callable[[str], list[int]]
    extra: str = ""  # more of the cluster file
    runtime: str = "podman"
    lab: TestHostLab | None = None  # the simulated hosts, when not on localhost


@pytest.fixture(scope="module")
def cx_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestHostLab, Path]]:
    """Two simulated hosts, whose SSH sessions reach the host's own podman and dockerd; the
    folder of the runtimes' files."""
    require_netns()
    base = tmp_path_factory.mktemp("cx")
    env = {**HostPodmanLab.session_env(base / "podman"), **HostDockerLab.session_env(base / "docker")}
    with TestHostLab(
        2, workdir=base / "lab", prefix="tfctl-cx", bridge="tfctlbr71", subnet="10.77.71", session_env=env
    ) as lab:
        yield lab, base


def on_ssh_hosts(
    kind: type[HostPodmanLab] | type[HostDockerLab], cx_lab: tuple[TestHostLab, Path], rootfs: Path
) -> Iterator[Hosts]:
    """Each host's runtime of this kind, started with the test image: the ps on one host, both
    workers on the other."""
    lab, base = cx_lab
    reason = skip_reason(kind.name)
    if reason is not None:
        pytest.skip(reason)
    runtimes: dict[str, Lab] = {h.name: kind(base / kind.name, h) for h in lab.hosts}
    try:
        with ThreadPoolExecutor() as pool:  # the hosts' runtimes start side by side
            list(pool.map(lambda runtime: runtime.start(rootfs), runtimes.values()))

        def tfctl_pids(host: str) -> list[int]:
            return [p for p in lab.host(host).pids() if is_supervisor(proc_cmdline(p), ".tfctl/supervisor-")]

        ssh = f"ssh: {{config: {lab.ssh_config}, connect_timeout: 10, keepalive: 1}}\nhost_timeout: 10\n"
        yield Hosts("tfh0:2222", ["tfh1:2222", "tfh1:2223"], runtimes, tfctl_pids, ssh, kind.name, lab)
    finally:
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda runtime: runtime.tear_down(), runtimes.values()))


@pytest.fixture(scope="module")
def ssh_hosts(cx_lab: tuple[TestHostLab, Path], rootfs: Path) -> Iterator[Hosts]:
    yield from on_ssh_hosts(HostPodmanLab, cx_lab, rootfs)


@pytest.fixture(scope="module")
def ssh_docker(cx_lab: tuple[TestHostLab, Path], rootfs: Path) -> Iterator[Hosts]:
    yield from on_ssh_hosts(HostDockerLab, cx_lab, rootfs)


def on_localhost(lab: Lab, home: Path) -> Hosts:
    ports = free_ports(3)

    def tfctl_pids(_host: str) -> list[int]:
        return [p for p in live_pids() if is_supervisor(proc_cmdline(p), f"{home}/supervisor-")]

    workers = [f"localhost:{p}" for p in ports[1:]]
    return Hosts(f"localhost:{ports[0]}", workers, {"localhost": lab}, tfctl_pids, runtime=lab.name)


@pytest.fixture
def localhost(podman_lab: Lab, home: Path) -> Hosts:
    return on_localhost(podman_lab, home)


@pytest.fixture
def localhost_docker(docker_lab: Lab, home: Path) -> Hosts:
    return on_localhost(docker_lab, home)


def is_supervisor(cmdline: str, zipapp: str) -> bool:
    """A supervisor's command line (`python -I -S .../supervisor-<hash>.pyz serve`), which its
    forked task monitors keep."""
    argv = cmdline.split()
    return len(argv) > 2 and argv[-1] == "serve" and zipapp in argv[-2]


def write_cluster(folder: Path, hosts: Hosts, worker_seconds: float) -> Path:
    """A ps and two workers of the stand-in task, each in its container; the workers end after
    `worker_seconds` (-1: never), the ps then by the idle rule on its host."""
    task = f"{{python}} {FAKE_TASK} --tick 0.05 --lines 0"
    tasks = FAKE_TASK.parent
    path = folder / "cluster.yaml"
    path.write_text(f"""name: cx
workdir: {folder}
python: {sys.executable}
grace_period: 1
startup_timeout: 60
lease_timeout: 2
idle_ps_timeout: 1
{hosts.extra}container: {{image: {IMAGE}, runtime: {hosts.runtime}, mounts: ["{tasks}:{tasks}:ro"]}}
jobs:
  ps:
    hosts: [{hosts.ps}]
    command: "{task} --name ps --port {hosts.ps.rsplit(":", 1)[1]} --sleep -1"
  worker:
    hosts: [{", ".join(hosts.workers)}]
    command: "{task} --name w{{task_index}} --port -1 --sleep {worker_seconds}"
""")
    return path


def left_containers(hosts: Hosts, run_id: str, but: str = "") -> dict[str, list[str]]:
    """The run's containers on each host (but one: a frozen host's dockerd answers nothing)."""
    label = f"{containers.RUN_LABEL}={run_id}"
    return {host: found for host, lab in hosts.runtimes.items() if host != but and (found := lab.containers(label))}


def wait_all_gone(hosts: Hosts, run_id: str, what: str) -> None:
    """Until no container of the run is left on any host, and no process of it, ALONE_WITHIN s."""
    wait_until(
        lambda: (left_containers(hosts, run_id), run_processes(run_id)),
        ALONE_WITHIN,
        what,
        until=lambda left: left == ({}, []),
        interval=0.2,
    )


def monitors(run_id: str) -> dict[str, int]:
    """Task -> root-namespace pid of its monitor: the parent of its container's `podman run`
    (or `docker run`)."""
    found = {}
    for pid in live_pids():
        argv = proc_cmdline(pid).split()
        runtime = os.path.basename(argv[0]) if argv else ""
        if runtime in ("podman", "docker") and "run" in argv and "--name" in argv:
            task = task_of(argv[argv.index("--name") + 1], run_id)
            if task is not None:
                found[task] = parent(pid)
    return found


def task_of(name: str, run_id: str) -> str | None:
    for task in ("ps:0", "worker:0", "worker:1"):
        if name == containers.name_for(run_id, task):
            return task
    return None


def parent(pid: int) -> int:
    stat = proc_stat(pid)
    assert stat is not None, f"pid {pid} is gone"
    return int(stat["ppid"])


def start(cluster: Path, home: Path, attached: bool) -> tuple[subprocess.Popen | None, str]:
    """The run started attached (its `up`, following) or detached; its id."""
    if not attached:
        up = tfctl("-f", str(cluster), "up", "-d", home=home)
        assert up.returncode == 0, up.stderr
        return None, up.stdout.strip()
    proc = spawn_tfctl("-f", str(cluster), "up", home=home, stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    wait_for_line(proc.stderr, "following", 90)
    return proc, json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]


def wait_for_exit(proc: subprocess.Popen, timeout: float) -> str:
    """The rest of an attached `up`'s errors, once it exited (killed after `timeout` seconds)."""
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        assert proc.stderr is not None
        rest = proc.stderr.read()
        proc.wait()
    finally:
        killer.cancel()
    return rest


def inject(fault: str, hosts: Hosts, home: Path, up: subprocess.Popen | None, run_id: str) -> list[int]:
    """SIGKILL what the fault names; the pids killed."""
    tasks = monitors(run_id)
    assert sorted(tasks) == ["ps:0", "worker:0", "worker:1"], tasks
    if fault == "monitor":
        victims = [tasks["worker:0"]]
    elif fault == "attached up":
        assert up is not None
        victims = [up.pid]
    elif fault == "watcher":
        watcher = RunStore(home).load(run_id).watcher
        assert watcher is not None and not watcher.attached
        victims = [watcher.pid]
    else:
        # The workers' host: its supervisor alone, or every tfctl process (the monitors too).
        on_host = hosts.tfctl_pids(hosts.workers[0].rsplit(":", 1)[0])
        kept = set(tasks.values()) if fault == "supervisor" else set()
        victims = [p for p in on_host if p not in kept]
        assert victims, f"no process to kill for {fault}: {on_host}"
        assert fault == "supervisor" or {tasks["worker:0"], tasks["worker:1"]} <= set(victims)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims


# Each fault on localhost and on SSH hosts with podman; docker (its daemon owns the container: a
# killed client's is left to the tether) for the monitor and every tfctl process, on SSH hosts
# each with a dockerd of its own.
CASES = [
    ("localhost_docker", "every tfctl process"),
    ("localhost", "monitor"),
    ("localhost", "supervisor"),
    ("localhost", "every tfctl process"),
    ("localhost", "attached up"),
    ("localhost", "watcher"),
    ("ssh", "monitor"),
    ("ssh", "supervisor"),
    ("ssh", "every tfctl process"),
    ("ssh", "attached up"),
    ("ssh", "watcher"),
    ("ssh_docker", "monitor"),
    ("ssh_docker", "every tfctl process"),
]


@pytest.mark.parametrize(("where", "fault"), CASES, ids=[f"{w}-{f.replace(' ', '-')}" for w, f in CASES])
def test_no_fault_leaves_a_container_or_a_process(
    where: str, fault: str, request: pytest.FixtureRequest, tmp_path: Path, home: Path
) -> None:
    hosts: Hosts = request.getfixturevalue({"ssh": "ssh_hosts"}.get(where, where))
    attached = fault == "attached up"
    # Workers that never end unless stopped: only the lease can end the attached run.
    cluster = write_cluster(tmp_path, hosts, -1 if attached else 4)
    up, run_id = start(cluster, home, attached)
    try:
        assert sum(len(c) for c in left_containers(hosts, run_id).values()) == 3
        killed_at = time.monotonic()
        inject(fault, hosts, home, up, run_id)
        wait_all_gone(hosts, run_id, f"{fault}: every container and process of {run_id} gone")
        took = time.monotonic() - killed_at
        print(f"{where}, {fault}: all gone {took:.1f}s after the SIGKILL")
        if attached:
            assert took >= 1.5  # not before the lease ran out
            status = tfctl("status", "--run", run_id, home=home)
            assert "(its lease ran out)" in status.stderr, status.stderr
    finally:
        if up is not None and up.poll() is None:
            up.kill()
        if up is not None:
            up.wait()
        down = tfctl("-f", str(cluster), "down", "--run", run_id, home=home)
    assert down.returncode == 0 and "0 remain" in down.stderr, down.stderr


def test_exec_reaches_the_tasks_container_on_an_ssh_host(ssh_hosts: Hosts, tmp_path: Path, home: Path) -> None:
    """`tfctl exec` through SSH: the words reach the container as written, and run in it (its
    first process is the tether) with the task's environment."""
    cluster = write_cluster(tmp_path, ssh_hosts, -1)
    _, run_id = start(cluster, home, attached=False)
    try:
        look = "tr '\\0' ' ' </proc/1/cmdline; echo; echo \"$TF_CONFIG\" \"${TFCTL_RUN_ID:-unmarked}\"; exit 5"
        done = tfctl("-f", str(cluster), "exec", "worker:1", "--", "sh", "-c", look, home=home)
        assert done.returncode == 5, done.stderr
        first, said = done.stdout.splitlines()[:2]
        assert "/tether.py " in first and '"task":{"type":"worker","index":1}' in said and said.endswith(" unmarked")
    finally:
        down = tfctl("-f", str(cluster), "down", "--run", run_id, home=home)
    assert down.returncode == 0 and "3 containers stopped on 2 hosts; 0 remain" in down.stderr, down.stderr


@pytest.mark.parametrize("where", ["ssh_hosts", "ssh_docker"])
def test_a_frozen_host_fails_the_run_and_thawed_leaves_no_container(
    where: str, request: pytest.FixtureRequest, tmp_path: Path, home: Path
) -> None:
    """Every process of the workers' host SIGSTOPped (its supervisor, monitors, conmons or
    dockerd and shims, and the containers' processes): the run fails after host_timeout, the
    other host's container is stopped meanwhile; thawed, the host's monitors find their lease run
    out and stop theirs."""
    hosts: Hosts = request.getfixturevalue(where)
    assert hosts.lab is not None
    cluster = write_cluster(tmp_path, hosts, -1)
    cluster.write_text(cluster.read_text().replace("host_timeout: 10", f"host_timeout: {FROZEN_FOR}"))
    up, run_id = start(cluster, home, attached=True)
    assert up is not None and up.stderr is not None
    host = hosts.workers[0].rsplit(":", 1)[0]
    frozen: set[int] = set()
    try:
        assert sum(len(c) for c in left_containers(hosts, run_id).values()) == 3
        tasks = monitors(run_id)
        froze = time.monotonic()
        frozen = freeze(hosts.lab.host(host))
        assert {tasks["worker:0"], tasks["worker:1"]} <= frozen
        rest = wait_for_exit(up, 60)
        failed_after = time.monotonic() - froze
        assert up.returncode == 1, rest
        assert re.search(rf"lost contact with {host} since \d\d:\d\d:\d\d \({FROZEN_FOR}s, host_timeout\)", rest), rest
        # The healthy host's container is stopped with the run (a frozen dockerd answers nothing:
        # not asked); the frozen host's tasks, conmons and shims are left as they were.
        assert left_containers(hosts, run_id, but=host) == {}
        kept = {p for p in run_processes(run_id) if p in frozen}
        assert {p for p in kept if proc_env_markers(p)[0] == run_id}, kept  # its tasks and tethers
        # What still ran was stopped cleanly: SIGTERM reached the ps through its tether.
        rows = {
            line.split()[0]: line.split() for line in tfctl("status", "--run", run_id, home=home).stdout.splitlines()
        }
        assert rows["ps:0"][2] == "stopped" and rows["ps:0"][4] == "143", rows
        assert rows["worker:0"][2] == rows["worker:1"][2] == "unreachable", rows
    finally:
        thaw(frozen)
        if up.poll() is None:
            up.kill()
        up.wait()
    thawed = time.monotonic()
    wait_all_gone(hosts, run_id, f"the thawed {host} stopping every container and process of {run_id}")
    print(
        f"{where}: up failed {failed_after:.1f}s after the freeze; thawed, all gone in {time.monotonic() - thawed:.1f}s"
    )
    down = tfctl("-f", str(cluster), "down", "--run", run_id, home=home)
    assert down.returncode == 0 and "0 remain" in down.stderr, down.stderr  # containers counted in it


@pytest.mark.tf
def test_the_parameter_server_template_trains_in_containers_on_ssh_hosts(
    ssh_hosts: Hosts, tmp_path: Path, home: Path
) -> None:
    """The parameter-server template across the two hosts, the ps and chief on one, the workers
    on the other, each task in its host's podman with TensorFlow from the suite's venv: it
    trains to its accuracy, and leaves no container or process on either host."""
    cluster = copy_template("parameter-server", tmp_path, train_steps=200, extra=ssh_hosts.extra + boxed_tf())
    ps_host, worker_host = ssh_hosts.ps.split(":")[0], ssh_hosts.workers[0].split(":")[0]
    text = cluster.read_text()
    jobs = f"jobs:\n  ps: [{ps_host}]\n  chief: [{ps_host}]\n  worker: [{worker_host}, {worker_host}]\n"
    cluster.write_text(
        text.replace("jobs:\n  ps: [localhost]\n  chief: [localhost]\n  worker: [localhost, localhost]\n", jobs)
    )
    assert jobs in cluster.read_text()
    up = run_up(cluster, home)
    check_common(up, "chief:0", 200)
    assert f"in podman image {IMAGE}), tensorflow " in up.stderr  # each host's preflight asked its image
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert left_containers(ssh_hosts, run_id) == {} and run_processes(run_id) == []
