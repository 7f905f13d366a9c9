"""tfctl over SSH, end to end, on simulated hosts: network namespaces each running a real sshd.

Every host has its own address, hostname and PID namespace; tasks reach each other by the
names in the lab's /etc/hosts. Traffic goes only to the lab's addresses.

Home modes: on an "own-home" lab every host's SSH sessions have a HOME of their own; on a
"shared-home" lab they all have the same one, as when home directories are on NFS (the norm on
lab and HPC clusters), so the hosts' ~/.tfctl is one directory. Each test names the modes it runs
in (`@homes(...)`); pytest groups the tests by mode, so each module run starts two labs. Tests
that exercise what hosts keep under ~ (supervisor copy, sync cache, task state, logs, stopping)
run in both; those about SSH itself (host keys, jump hosts, unreachable hosts, quoting) run in
"own" only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.netns_hosts import TestHost, TestHostLab, require_netns
from bench.waiting import WaitTimeout, wait_until
from tests.conftest import FAKE_TASK, REPO, read_rest, spawn_tfctl, tfctl, wait_for_line
from tfctl.supervisor.procfs import proc_env_markers

pytestmark = pytest.mark.netns
PORT = 2222  # the same port on every host: each host is its own network namespace
OWN, SHARED = "own", "shared"


def homes(*modes: str):
    """Run the test on a lab whose hosts each have their own HOME ("own") and/or share one ("shared")."""
    return pytest.mark.parametrize(
        "home_mode", modes, indirect=True, scope="module", ids=[f"{mode}-home" for mode in modes]
    )


@pytest.fixture(scope="module")
def home_mode(request) -> str:
    return getattr(request, "param", OWN)


@pytest.fixture(scope="module")
def lab(home_mode, tmp_path_factory):
    """3 hosts tfh0..tfh2; with home_mode "shared" every host's ~ is the same directory."""
    require_netns()
    workdir = tmp_path_factory.mktemp(f"netns-lab-{home_mode}-home")
    with TestHostLab(
        3, workdir=workdir, prefix="tfctl-sc", bridge="tfctlbr54", subnet="10.77.54", shared_home=home_mode == SHARED
    ) as lab:
        assert lab.home_mode == home_mode
        yield lab


# Host-side paths. The supervisor keeps what is its host's own under
# ~/.tfctl/hosts/<hostname>-<first 12 chars of /etc/machine-id>/ (tasks/<run>/<job>-<index>/,
# requests/), so hosts sharing a home never share state; the supervisor copy, sync caches
# (sync/<cluster>) and synced workdirs (work/<run>) sit directly under ~/.tfctl.


def remote_root(host: TestHost) -> Path:
    """~/.tfctl as `host`'s SSH sessions see it (the same directory for every host if the home is shared)."""
    return Path(host.home) / ".tfctl"


def host_state_dir(host: TestHost) -> Path:
    """Where the supervisor on `host` keeps its own state, in either home mode."""
    return remote_root(host) / "hosts" / f"{host.name}-{host.machine_id.replace('-', '')[:12]}"


def host_task_dir(host: TestHost, run_id: str, task: str) -> Path:
    """A task's files on its host: spec.json, proc.json, output.log, ..."""
    return host_state_dir(host) / "tasks" / run_id / task.replace(":", "-")


def distinct_roots(lab) -> list[Path]:
    """Each distinct ~/.tfctl of the lab's hosts: one per host, or one for all of them."""
    return sorted({remote_root(h) for h in lab.hosts})


def forget_hosts_state(lab) -> None:
    """Remove ~/.tfctl on every host, so the next command makes first contact everywhere at once
    (supervisor copy, filesystem token, sync cache: what hosts sharing a home race for)."""
    for root in distinct_roots(lab):
        shutil.rmtree(root, ignore_errors=True)


def run_tasks(lab, run_id: str) -> dict[str, set[str]]:
    """TFCTL_TASK of each process of a run, per lab host."""
    return {host: {proc_env_markers(p)[1] or "" for p in pids} for host, pids in run_pids(lab, run_id).items()}


def run_pids(lab, run_id: str) -> dict[str, list[int]]:
    """Processes of a run on each lab host (seen from here: PID namespaces nest in ours)."""
    found = {}
    for host in lab.hosts:
        pids = [p for p in host.pids() if proc_env_markers(p)[0] == run_id]
        if pids:
            found[host.name] = pids
    return found


def workdir_with_fake_task(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(FAKE_TASK, work / "fake_task.py")
    (work / "__pycache__").mkdir(exist_ok=True)
    (work / "__pycache__" / "junk.pyc").write_bytes(b"not synced")
    return work


def write_cluster(
    tmp_path: Path, lab, jobs: str, command: str, extra: str = "", workdir: Path | None = None, name: str = "ssh"
) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"""name: {name}
workdir: {workdir or workdir_with_fake_task(tmp_path)}
python: {sys.executable}
grace_period: 2
startup_timeout: 60
ssh:
  config: {lab.ssh_config}
  connect_timeout: 3
command: "{command}"
{extra}
jobs:
{jobs}
""")
    return path


JOBS = f"""  ps: [tfh0:{PORT}]
  worker: [tfh1:{PORT}, tfh2:{PORT}]"""


@pytest.fixture
def no_leftovers(lab):
    """After the test, nothing carrying a tfctl marker runs on any lab host."""
    yield

    def left() -> dict[str, list[int]]:
        found = {h.name: [p for p in h.pids() if proc_env_markers(p)[0]] for h in lab.hosts}
        return {k: v for k, v in found.items() if v}

    try:
        wait_until(left, 5, "no tfctl process on the lab hosts", until=lambda found: not found, interval=0.1)
    except WaitTimeout as late:
        assert isinstance(late.last, dict)
        for pids in late.last.values():
            for pid in pids:
                os.kill(pid, 9)
        pytest.fail(f"processes left on lab hosts: {late.last}")


@homes(OWN, SHARED)
def test_detached_up_status_down_over_ssh_with_sigterm_ignoring_workers(tmp_path, home, lab, no_leftovers):
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"
    jobs = (
        f'  ps: [tfh0:{PORT}]\n  worker:\n    hosts: [tfh1:{PORT}, tfh2:{PORT}]\n    command: "{command} --ignore-term"'
    )
    cluster = write_cluster(tmp_path, lab, jobs, command, name="detached")  # a sync cache of its own
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    for host in ("tfh0", "tfh1", "tfh2"):
        assert f"{host}" in up.stderr and "synced: 1 of 1 files changed" in up.stderr  # the .pyc stayed home
    assert f"reachability: 3 hosts -> tfh0:{PORT}: all 3 connections ok" in up.stderr
    tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
    assert [(t["task"], t["host"], t["state"]) for t in tasks] == [
        ("ps:0", "tfh0", "running"),
        ("worker:0", "tfh1", "running"),
        ("worker:1", "tfh2", "running"),
    ]
    wait_until(
        lambda: json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"],
        15,
        "every task listening",
        until=lambda tasks: all(t["listening"] for t in tasks),
        interval=0.3,
    )
    # Each task ran on its own host, in the synced copy, and saw the cluster through TF_CONFIG.
    logs = tfctl("-f", str(cluster), "logs", home=home).stdout
    assert '"task":{"type":"worker","index":1}' in logs
    assert set(run_pids(lab, run_id)) == {"tfh0", "tfh1", "tfh2"}
    assert lab.host("tfh2").exec(["hostname"]).stdout.strip() == "tfh2"

    began = time.monotonic()
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert f"processes stopped on 3 hosts; 0 remain; port {PORT} free" in down.stderr
    assert time.monotonic() - began > 2  # the workers ignored SIGTERM: the grace period ran out first
    assert run_pids(lab, run_id) == {}
    states = {
        t["task"]: (t["state"], t["signal"])
        for t in json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
    }
    assert states == {"ps:0": ("stopped", 15), "worker:0": ("stopped", 9), "worker:1": ("stopped", 9)}


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
@homes(OWN, SHARED)
def test_every_host_keeps_its_own_state_whether_or_not_homes_are_shared(
    tmp_path, home, lab, home_mode, sync, no_leftovers
):
    """up -d, status, logs and down on 3 hosts from first contact (no ~/.tfctl anywhere yet).

    Shared home: one ~/.tfctl for all hosts, so the supervisor copy, the sync cache and the synced
    workdir are one, while each host's tasks, logs and journal stay under its own
    hosts/<hostname>-<machine id>/. Without sync the workdir itself is on the shared home.
    """
    forget_hosts_state(lab)
    if sync:
        work = workdir_with_fake_task(tmp_path)
    else:  # the workdir as every host sees it: on the shared home, or a path all hosts share
        base = Path(lab.hosts[0].home) if home_mode == SHARED else tmp_path
        work = workdir_with_fake_task(base / f"project-{tmp_path.name}")
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --lines 3 --sleep -1"
    extra = "" if sync else "sync: false"
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra=extra, workdir=work, name=f"state-{home_mode}")
    expected = {"ps:0": "tfh0", "worker:0": "tfh1", "worker:1": "tfh2"}

    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    try:
        assert up.returncode == 0, up.stderr
        run_id = up.stdout.strip()
        if sync:
            copies = 1 if home_mode == SHARED else 3  # one copy per filesystem
            assert up.stderr.count("synced: 1 of 1 files changed") == copies, up.stderr
            for root in distinct_roots(lab):
                synced = root / "work" / run_id
                assert (synced / "fake_task.py").is_file() and not (synced / "__pycache__").exists()
        else:
            assert "synced:" not in up.stderr
            # the run's own directory ($TFCTL_RUN_DIR) exists, but nothing was copied into it
            assert not any((root / "work" / run_id / "fake_task.py").exists() for root in distinct_roots(lab))

        # status: every task runs, on its own host
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        assert sorted((t["task"], t["host"], t["state"]) for t in tasks) == [
            (task, host, "running") for task, host in sorted(expected.items())
        ]
        assert run_tasks(lab, run_id) == {host: {task} for task, host in expected.items()}

        # host-side state: each host's under its own key, none in the old shared places
        for task, host_name in expected.items():
            host = lab.host(host_name)
            assert (host_task_dir(host, run_id, task) / "spec.json").is_file(), task
            for other in lab.hosts:
                if other.name != host_name:
                    assert not host_task_dir(other, run_id, task).exists(), (task, other.name)
        for root in distinct_roots(lab):
            # nothing in the places where state lived before it was per host
            assert not (root / "tasks").exists() and not (root / "requests").exists()
            keys = sorted(p.name for p in (root / "hosts").iterdir())
            owners = lab.hosts if home_mode == SHARED else [h for h in lab.hosts if remote_root(h) == root]
            assert keys == sorted(host_state_dir(h).name for h in owners)

        # logs: every task's lines
        want = [(task, f"{task.replace(':', '')} line {i}") for task in expected for i in range(3)]

        def logs_and_missing() -> tuple[subprocess.CompletedProcess, list[tuple[str, str]]]:
            logs = tfctl("-f", str(cluster), "logs", home=home)
            parts = (line.partition("]") for line in logs.stdout.splitlines())  # "[ps:0]     ps0 line 0"
            seen = {(label.lstrip("["), text.strip()) for label, _, text in parts}
            return logs, [(task, text) for task, text in want if (task, text) not in seen]

        logs, _ = wait_until(
            logs_and_missing, 15, "every task's lines in `logs`", until=lambda got: not got[1], interval=0.3
        )
        assert logs.returncode == 0, logs.stdout + logs.stderr
        for task, host_name in expected.items():
            assert "line 2" in (host_task_dir(lab.host(host_name), run_id, task) / "output.log").read_text()
    except BaseException:
        tfctl("-f", str(cluster), "down", home=home)  # leave nothing up for the next tests
        raise

    # down: stops everything everywhere, and says so
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert "could not be checked" not in down.stderr
    assert f"processes stopped on 3 hosts; 0 remain; port {PORT} free" in down.stderr
    assert run_pids(lab, run_id) == {}
    assert {h.name: [p for p in h.pids() if proc_env_markers(p)[0]] for h in lab.hosts} == {
        h.name: [] for h in lab.hosts
    }
    states = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
    assert {t["task"]: t["state"] for t in states} == {task: "stopped" for task in expected}
    # every temporary name was renamed or removed, even where three hosts wrote side by side
    assert [p for root in distinct_roots(lab) for p in root.rglob("*") if ".tmp" in p.name] == []


@homes(OWN, SHARED)
def test_attached_run_over_ssh_ends_and_leaves_nothing(tmp_path, home, lab, no_leftovers):
    command = (
        "{python} fake_task.py --name {job_name}{task_index} --port 2222 --lines 3 "
        "--sleep $( [ {job_name} = ps ] && echo -1 || echo 4 )"
    )  # 4 s: worker:1 starts once worker:0 listens, and must print before worker:0 ends the job
    cluster = write_cluster(tmp_path, lab, JOBS, command)
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    assert "job succeeded: worker:0 finished successfully" in up.stderr
    for task in ("ps:0", "worker:0", "worker:1"):
        assert f"[{task}]" in up.stdout
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_pids(lab, run_id) == {}


@homes(OWN, SHARED)
def test_setup_runs_once_per_workdir_so_hosts_sharing_a_home_never_install_at_once(
    tmp_path, home, lab, home_mode, no_leftovers
):
    """On a shared home the synced workdir is one directory: its setup (a virtualenv, say) runs
    once, from one host; with a home per host, every host sets up its own copy."""
    setup = 'setup: ["hostname >> setup-ran", "sleep 1"]'
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --lines 1 --sleep 0"
    cluster = write_cluster(tmp_path, lab, "  worker: [tfh0:2222, tfh1:2222, tfh2:2222]", command, extra=setup)
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    ran = {root: (root / "work" / run_id / "setup-ran").read_text().split() for root in distinct_roots(lab)}
    if home_mode == SHARED:
        assert list(ran.values()) == [["tfh0"]]
        for other in ("tfh1", "tfh2"):
            assert f"{other}         shares its workdir with tfh0: set up there, once" in up.stderr
    else:
        assert sorted(ran.values()) == [["tfh0"], ["tfh1"], ["tfh2"]]
        assert "shares its workdir" not in up.stderr
    assert up.stderr.count("setup done") == len(ran)
    assert run_pids(lab, run_id) == {}


@homes(OWN, SHARED)
def test_each_host_stops_the_tasks_of_a_killed_attached_up_once_its_lease_ran_out(tmp_path, home, lab, no_leftovers):
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra="lease_timeout: 2")
    up = spawn_tfctl("-f", str(cluster), "up", home=home, stdout=subprocess.DEVNULL)
    try:
        assert up.stderr is not None
        wait_for_line(up.stderr, "following", 60)
        run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
        time.sleep(3)  # deliberately past the 2 s lease: a live controller renews it, nothing stops
        assert sorted(run_pids(lab, run_id)) == ["tfh0", "tfh1", "tfh2"]
    finally:
        up.kill()
        up.wait()
    wait_until(lambda: run_pids(lab, run_id) == {}, 15, "every host stopping its tasks", interval=0.2)
    status = tfctl("-f", str(cluster), "status", "--json", home=home)
    assert "its job had ended: recorded as stopped" in status.stderr  # every task had stopped: decided at once
    assert all("no controller for" in t["stop_reason"] for t in json.loads(status.stdout)["tasks"])
    wait_until(lambda: runs(home)[-1]["state"] == "stopped", 20, "run end", interval=0.2)


@homes(OWN, SHARED)
def test_a_detached_runs_ps_stops_on_its_host_when_the_job_ends_without_any_tfctl(tmp_path, home, lab, no_leftovers):
    command = (
        "{python} fake_task.py --name {job_name}{task_index} --port 2222 "
        "--sleep $( [ {job_name} = ps ] && echo -1 || echo 5 )"
    )
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra="idle_ps_timeout: 1")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    watcher = json.loads((home / "runs" / run_id / "run.json").read_text())["watcher"]
    os.kill(watcher["pid"], 9)  # the laptop is gone; the ps on tfh0 probes the workers itself
    wait_until(lambda: run_pids(lab, run_id) == {}, 30, "the ps stopping on its host", interval=0.2)
    status = tfctl("-f", str(cluster), "status", "--json", home=home)
    ps = {t["task"]: t for t in json.loads(status.stdout)["tasks"]}["ps:0"]
    assert ps["state"] == "stopped" and "worker:0 gone" in ps["stop_reason"]
    wait_until(lambda: runs(home)[-1]["state"] == "succeeded", 20, "end", interval=0.2)


@homes(OWN)
def test_a_host_gone_silent_fails_the_run_after_host_timeout_and_down_cleans_it_once_back(
    tmp_path, home, lab, no_leftovers
):
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra="host_timeout: 4")
    cluster.write_text(cluster.read_text().replace("connect_timeout: 3", "connect_timeout: 3\n  keepalive: 1"))
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    tfh2 = lab.host("tfh2")
    tfh2.set_link(False)
    try:
        began = time.monotonic()
        wait_until(lambda: runs(home)[-1]["state"] == "failed", 60, "the run failing", interval=0.2)
        assert time.monotonic() - began >= 4
        assert re.match(r"lost contact with tfh2 since \d\d:\d\d:\d\d \(4s, host_timeout\)", runs(home)[-1]["reason"])
        status = tfctl("-f", str(cluster), "status", "--json", home=home)
        tasks = {t["task"]: t for t in json.loads(status.stdout)["tasks"]}
        assert tasks["worker:1"]["state"] == "unreachable" and tasks["worker:1"]["unreachable_since"] is not None
        assert tasks["ps:0"]["state"] == tasks["worker:0"]["state"] == "stopped"  # the watcher stopped the rest
        assert "unreachable" in tfctl("-f", str(cluster), "status", home=home).stdout
        assert sorted(run_pids(lab, run_id)) == ["tfh2"]  # still running there: nobody could tell it
        down = tfctl("-f", str(cluster), "down", home=home)
        assert down.returncode == 1 and "tfh2" in down.stderr
    finally:
        tfh2.set_link(True)
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr
    assert run_pids(lab, run_id) == {}


def runs(home: Path) -> list[dict]:
    return json.loads(tfctl("runs", "--json", home=home).stdout)


@homes(OWN)
def test_shell_metacharacters_in_cluster_values_are_never_executed(tmp_path, home, lab, no_leftovers):
    canary = "/tmp/tfctl-canary"
    hostile = f"$(touch {canary}-1); `touch {canary}-2`; touch {canary}-3 | echo \"'\\$HOME"
    for host in lab.hosts:
        host.exec(["rm", "-f", f"{canary}-1", f"{canary}-2", f"{canary}-3"])
    work = workdir_with_fake_task(tmp_path / "dir with space $(touch x)")
    (work / "print_env.py").write_text("import os\nprint('HOSTILE=' + os.environ['HOSTILE'])\n")
    jobs = f"  worker: [tfh1:{PORT}]"
    cluster = write_cluster(
        tmp_path, lab, jobs, "{python} print_env.py", workdir=work, extra=f"env:\n  HOSTILE: {json.dumps(hostile)}"
    )
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    assert f"[worker:0] HOSTILE={hostile}" in up.stdout
    for host in lab.hosts:
        assert host.exec(["sh", "-c", f"ls {canary}-* 2>/dev/null"]).stdout == ""
    # An interpreter path full of shell syntax is one (missing) file, not a command line.
    bad = cluster.read_text().replace(f"python: {sys.executable}", f"python: '/nonexistent/py; touch {canary}-4'")
    cluster.write_text(bad)
    result = tfctl("-f", str(cluster), "up", home=home)
    assert result.returncode != 0
    assert "tfh1" in result.stderr
    assert lab.host("tfh1").exec(["sh", "-c", f"ls {canary}-4 2>/dev/null"]).stdout == ""


@homes(OWN)
def test_unknown_host_key_is_refused_and_accept_new_pins_it(tmp_path, home, lab, no_leftovers):
    empty_known = tmp_path / "known_hosts"
    empty_known.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(lab.ssh_config.read_text().replace(str(lab.known_hosts), str(empty_known)))
    command = "{python} fake_task.py --port 2222 --sleep 0"
    cluster = write_cluster(tmp_path, lab, f"  worker: [tfh1:{PORT}]", command)
    cluster.write_text(cluster.read_text().replace(str(lab.ssh_config), str(config)))
    refused = tfctl("-f", str(cluster), "up", home=home)
    assert refused.returncode == 1
    assert "unknown host key" in refused.stderr and "tfh1" in refused.stderr and "SHA256:" in refused.stderr
    assert "--accept-new-host-keys" in refused.stderr
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())  # nothing was started

    accepted = tfctl("-f", str(cluster), "up", "--accept-new-host-keys", home=home)
    assert accepted.returncode == 0, accepted.stderr
    pinned = (home / "known_hosts").read_text()
    assert lab.host("tfh1").address in pinned
    strict = tfctl("-f", str(cluster), "up", home=home)  # strict again: the pinned key is known now
    assert strict.returncode == 0, strict.stderr


@homes(OWN)
def test_changed_host_key_is_a_hard_error_naming_both_fingerprints(tmp_path, home, lab, no_leftovers):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = other.with_suffix(".pub").read_text().split()
    address = lab.host("tfh1").address
    known = tmp_path / "known_hosts"
    known.write_text(f"{address} {wrong[0]} {wrong[1]}\n")
    config = tmp_path / "ssh_config"
    config.write_text(lab.ssh_config.read_text().replace(str(lab.known_hosts), str(known)))
    cluster = write_cluster(tmp_path, lab, f"  worker: [tfh1:{PORT}]", "{python} fake_task.py --sleep 0")
    cluster.write_text(cluster.read_text().replace(str(lab.ssh_config), str(config)))
    result = tfctl("-f", str(cluster), "up", "--accept-new-host-keys", home=home)
    assert result.returncode == 1
    assert "changed" in result.stderr.lower() and result.stderr.count("SHA256:") >= 2
    assert run_pids(lab, "") == {}


@homes(OWN)
def test_unreachable_host_fails_preflight_fast_and_nothing_starts(tmp_path, home, lab, no_leftovers):
    command = "{python} fake_task.py --port 2222 --sleep -1"
    cluster = write_cluster(tmp_path, lab, JOBS, command)
    lab.host("tfh2").set_link(False)
    try:
        began = time.monotonic()
        result = tfctl("-f", str(cluster), "up", home=home)
        took = time.monotonic() - began
    finally:
        lab.host("tfh2").set_link(True)
        lab.host("tfh2").wait_port(22, timeout=10)
    assert result.returncode == 1
    assert "tfh2" in result.stderr and "timed out after 3s" in result.stderr
    assert took < 3 + 5
    for host in ("tfh0", "tfh1"):
        assert not [p for p in lab.host(host).pids() if proc_env_markers(p)[0]]


@homes(OWN, SHARED)
def test_worker_that_cannot_reach_the_ps_is_reported_and_nothing_stays(tmp_path, home, lab, no_leftovers):
    ps = lab.host("tfh0").address
    blocker = lab.host("tfh2")
    blocker.exec(["ip", "route", "add", "unreachable", f"{ps}/32"], check=True)
    try:
        command = "{python} fake_task.py --port 2222 --sleep -1"
        result = tfctl("-f", str(write_cluster(tmp_path, lab, JOBS, command)), "up", home=home)
    finally:
        blocker.exec(["ip", "route", "del", "unreachable", f"{ps}/32"], check=True)
    assert result.returncode == 1
    assert "1 of 3 connections failed in the reachability check" in result.stderr
    assert f"tfh2 -> tfh0:{PORT}: no route to that address from this host" in result.stderr
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_pids(lab, run_id) == {}  # the ps that had started was stopped again


@homes(OWN)
def test_host_reached_only_through_a_jump_host(tmp_path, home, lab, no_leftovers):
    hidden = lab.host("tfh2")
    hidden.exec(["ip", "route", "add", "blackhole", f"{lab.gateway}/32"], check=True)  # no way back to us
    config = tmp_path / "ssh_config"
    config.write_text(
        lab.ssh_config.read_text()
        + f"\nHost tfh2-via-tfh1\n    HostName {hidden.address}\n    ProxyJump tfh1\n"
        + f'    User root\n    IdentityFile "{lab.client_key}"\n'
        + f'    UserKnownHostsFile "{lab.known_hosts}"\n'
    )
    try:
        command = (
            "{python} fake_task.py --name {job_name}{task_index} --port 2222 --lines 1 "
            "--sleep $( [ {job_name} = ps ] && echo -1 || echo 1 )"
        )
        cluster = write_cluster(tmp_path, lab, JOBS, command, extra="hosts:\n  tfh2: {ssh: tfh2-via-tfh1}")
        cluster.write_text(cluster.read_text().replace(str(lab.ssh_config), str(config)))
        up = tfctl("-f", str(cluster), "up", home=home)
    finally:
        hidden.exec(["ip", "route", "del", "blackhole", f"{lab.gateway}/32"], check=True)
    assert up.returncode == 0, up.stderr
    assert "[worker:1] worker1 started" in up.stdout


@homes(OWN)
def test_logs_follow_resumes_after_the_link_drops_without_loss_or_repeats(tmp_path, home, lab, no_leftovers):
    count = 60
    work = workdir_with_fake_task(tmp_path)
    (work / "ticker.py").write_text(
        f"import time\nfor i in range({count}):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
    )
    cluster = write_cluster(tmp_path, lab, f"  worker: [tfh1:{PORT}]", "{python} ticker.py", workdir=work, extra="")
    cluster.write_text(cluster.read_text().replace("connect_timeout: 3", "connect_timeout: 3\n  keepalive: 1"))
    assert tfctl("-f", str(cluster), "up", "-d", home=home).returncode == 0
    follower = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "logs", "-f"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    assert follower.stdout is not None
    assert follower.stdout.readline().startswith("[worker:0] tick 0")
    lab.host("tfh1").set_link(False)
    time.sleep(4)  # deliberately down longer than the keepalive-based timeout: the stream notices, reconnects
    lab.host("tfh1").set_link(True)
    out = read_rest(follower, timeout=60)  # not communicate(): it would drop what readline() buffered
    ticks = ["[worker:0] tick 0"] + [line for line in out.splitlines() if "tick" in line]
    assert ticks == [f"[worker:0] tick {i}" for i in range(count)]


@pytest.mark.tf
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
@homes(OWN)
def test_mnist_on_three_hosts_through_ssh(tmp_path, home, lab, no_leftovers):
    command = (
        "{python} train.py --job_name={job_name} --task_index={task_index} "
        "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --train_steps 3000"
    )
    cluster = write_cluster(tmp_path, lab, JOBS, command, workdir=REPO / "examples" / "mnist", name="mnist-ssh")
    cluster.write_text(cluster.read_text().replace("grace_period: 2", "grace_period: 5"))
    up = tfctl("-f", str(cluster), "up", home=home, timeout=300)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    assert "[worker:0] final test accuracy" in up.stdout
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_pids(lab, run_id) == {}


@homes(OWN)
def test_check_reports_versions_and_a_blocked_route_without_starting_anything(tmp_path, home, lab, no_leftovers):
    cluster = write_cluster(tmp_path, lab, JOBS, "{python} fake_task.py --sleep 0")
    ok = tfctl("-f", str(cluster), "check", "--json", home=home)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert [h["hostname"] for h in report["hosts"]] == ["tfh0", "tfh1", "tfh2"]
    assert all(h["tensorflow"] for h in report["hosts"]) and report["warnings"] == []
    assert report["network"] == f"reachability: 3 hosts -> tfh0:{PORT}: all 3 connections ok"
    ps = lab.host("tfh0").address
    lab.host("tfh1").exec(["ip", "route", "add", "unreachable", f"{ps}/32"], check=True)
    try:
        blocked = tfctl("-f", str(cluster), "check", home=home)
    finally:
        lab.host("tfh1").exec(["ip", "route", "del", "unreachable", f"{ps}/32"], check=True)
    assert blocked.returncode == 1
    assert f"tfh1 -> tfh0:{PORT}: no route to that address from this host" in blocked.stderr
    assert not (home / "runs").exists()
