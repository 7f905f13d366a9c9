"""Over real SSH, on simulated hosts: ProxyCommand, `setup:` commands, and `runs --prune`.

The lab has a prefix, bridge and subnet of its own, so it runs beside the other modules' labs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from bench.netns_hosts import TestHost, make_lab_fixture
from tests.conftest import tfctl
from tfctl.errors import HostError
from tfctl.supervisor.procfs import proc_env_markers
from tfctl.transport.proxy import proxy_command
from tfctl.transport.ssh import SSHTransport

lab = make_lab_fixture(3, scope="module", prefix="tfctl-p", bridge="tfctlbr5", subnet="10.77.5")
PORT = 2222  # the same port on every host: each host is its own network namespace
WORKERS = f"  worker: [tfh1:{PORT}, tfh2:{PORT}]"


def proxied_config(lab, tmp_path: Path, proxy: str, target: int = 2) -> Path:
    """The lab's ssh config plus `via-proxy`: host `target`, reached through `proxy`."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        lab.ssh_config.read_text()
        + f"""
Host via-proxy
    HostName {lab.hosts[target].address}
    User root
    IdentityFile "{lab.client_key}"
    IdentitiesOnly yes
    UserKnownHostsFile "{lab.known_hosts}"
    ProxyCommand {proxy}
"""
    )
    return cfg


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- ProxyCommand ---------------------------------------------------------------------------------


def test_proxy_command_tokens_are_filled_in_and_quoted() -> None:
    assert proxy_command("ssh -W %h:%p -l %r jump # %n %%", "10.0.0.5", 2200, "ml", "gpu1") == (
        "ssh -W 10.0.0.5:2200 -l ml jump # gpu1 %"
    )
    assert proxy_command("nc %h %p", "a;rm -rf ~", 22, "u", "x") == "nc 'a;rm -rf ~' 22"
    with pytest.raises(ValueError, match="%C"):
        proxy_command("connect %C", "h", 22, "u", "x")


@pytest.mark.netns
def test_a_connection_goes_through_the_proxy_command(lab, tmp_path: Path) -> None:
    cfg = proxied_config(lab, tmp_path, f'ssh -F "{lab.ssh_config}" -W %h:%p tfh0')
    t = SSHTransport("worker", destination="via-proxy", ssh_config_path=cfg)
    try:
        r = t.run("hostname; echo $SSH_CONNECTION")
        name, client, _, server, port = r.stdout.split()
        # tfh2 saw the connection come from tfh0: it went through `ssh -W` there.
        assert (name, client, server, port) == ("tfh2", lab.hosts[0].address, lab.hosts[2].address, "22")
        t.put(b"through a proxy", "~/proxied", 0o600)
        assert t.run("cat ~/proxied").stdout == "through a proxy"
        proxy = t._proxies[0].proc
        assert proxy.poll() is None
    finally:
        t.close()
    assert proxy.poll() is not None and gone(proxy.pid)  # reaped: no process outlives the connection
    assert t.run("hostname").stdout == "tfh2\n"  # and a new connection starts a new one
    t.close()


@pytest.mark.netns
def test_a_port_and_user_from_the_cluster_file_reach_the_proxy_command(lab, tmp_path: Path) -> None:
    """%p and %r are what tfctl connects with, not only what the ssh config says."""
    log = tmp_path / "proxy.log"
    cfg = proxied_config(
        lab, tmp_path, f'sh -c \'echo "$0 $1" > {log}; exec ssh -F "{lab.ssh_config}" -W %h:22 tfh0\' %p %r'
    )
    t = SSHTransport("worker", destination="via-proxy", ssh_config_path=cfg, port=2200, user="root")
    try:
        with pytest.raises(HostError, match="unknown host key"):  # known for port 22 only; tokens matter here
            t.run("true", timeout=20)
    finally:
        t.close()
    assert log.read_text().split() == ["2200", "root"]


@pytest.mark.netns
def test_a_failing_proxy_command_says_what_it_said(lab, tmp_path: Path) -> None:
    cfg = proxied_config(lab, tmp_path, "sh -c 'echo no route to the bastion >&2; exit 7'")
    t = SSHTransport("worker", destination="via-proxy", ssh_config_path=cfg, connect_timeout=5)
    began = time.monotonic()
    with pytest.raises(HostError) as err:
        t.run("true")
    assert time.monotonic() - began < 5  # the command's end is noticed, not waited out
    assert "exited with code 7: no route to the bastion" in err.value.message
    assert "ProxyCommand=" in (err.value.hint or "")
    assert all(p.proc.poll() is not None for p in t._proxies)
    t.close()


@pytest.mark.netns
def test_check_reaches_a_cluster_host_through_a_proxy_command(lab, tmp_path: Path, home: Path) -> None:
    cfg = proxied_config(lab, tmp_path, f'ssh -F "{lab.ssh_config}" -W %h:%p tfh1')
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        f"name: proxied\npython: {sys.executable}\ncommand: sleep 1\n"
        f"ssh: {{config: {cfg}, connect_timeout: 5}}\nhosts:\n  tfh2: {{ssh: via-proxy}}\n"
        f"jobs:\n  worker: [tfh0:{PORT}, tfh2:{PORT}]\n"
    )
    check = tfctl("-f", str(cluster), "check", "--json", home=home)
    assert check.returncode == 0, check.stderr
    hosts = {h["host"]: h["hostname"] for h in json.loads(check.stdout)["hosts"]}
    assert hosts == {"tfh0": "tfh0", "tfh2": "tfh2"}


# -- runs --prune over SSH --------------------------------------------------------------------------


def cluster_file(tmp_path: Path, lab, name: str, command: str, jobs: str, extra: str = "") -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text("print('training')\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nworkdir: {work}\npython: {sys.executable}\ngrace_period: 1\n"
        f"ssh: {{config: {lab.ssh_config}, connect_timeout: 3}}\ncommand: '{command}'\n{extra}\njobs:\n{jobs}\n"
    )
    return path


def remote_files(host: TestHost, run_id: str) -> list[Path]:
    """A run's files on a host: its task state and logs, and its own directory (synced workdir,
    checkpoints)."""
    root = Path(host.home) / ".tfctl"
    return [*root.glob(f"hosts/*/tasks/{run_id}"), root / "work" / run_id]


CHECKPOINT = 'mkdir -p "$TFCTL_RUN_DIR/checkpoints" && echo saved > "$TFCTL_RUN_DIR/checkpoints/ckpt-1"'


@pytest.mark.netns
def test_prune_removes_runs_on_their_hosts_and_finishes_once_a_lost_host_is_back(
    lab, tmp_path: Path, home: Path
) -> None:
    cluster = cluster_file(tmp_path, lab, "prune", CHECKPOINT, WORKERS)
    h1, h2 = lab.hosts[1], lab.hosts[2]
    runs = []
    for _ in range(3):
        up = tfctl("-f", str(cluster), "up", home=home)
        assert up.returncode == 0, up.stderr
        runs.append(json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout)[-1]["run_id"])
    for run_id in runs:
        for host in (h1, h2):
            files = remote_files(host, run_id)
            assert len(files) == 2 and all(p.is_dir() for p in files), (host.name, files)
            assert (files[1] / "train.py").is_file() and (files[1] / "checkpoints" / "ckpt-1").is_file()

    first = tfctl("-f", str(cluster), "runs", "--prune", "--keep", "2", home=home)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "removed 1 of 1 runs" in first.stderr
    assert not any(p.exists() for host in (h1, h2) for p in remote_files(host, runs[0]))
    assert all(p.is_dir() for run_id in runs[1:] for host in (h1, h2) for p in remote_files(host, run_id))

    h2.set_link(False)
    try:
        lost = tfctl("-f", str(cluster), "runs", "--prune", "--keep", "0", home=home)
        assert lost.returncode == 1
        assert "error: tfh2 could not be reached" in lost.stderr and "removed 0 of 2 runs" in lost.stderr
        assert lost.stdout.count("kept, tfh2 could not be reached") == 2
        # What tfh1 held is gone; tfh2 keeps its part, and the records stay for the next prune.
        assert not any(p.exists() for run_id in runs[1:] for p in remote_files(h1, run_id))
        assert all(p.is_dir() for run_id in runs[1:] for p in remote_files(h2, run_id))
        listed = json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout)
        assert [r["run_id"] for r in listed] == runs[1:]
    finally:
        h2.set_link(True)
    done = tfctl("-f", str(cluster), "runs", "--prune", "--keep", "0", home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "removed 2 of 2 runs" in done.stderr
    assert not any(p.exists() for run_id in runs for host in (h1, h2) for p in remote_files(host, run_id))
    assert json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout) == []


# -- setup over SSH -------------------------------------------------------------------------------


def run_pids(lab, run_id: str) -> dict[str, list[int]]:
    """Processes of a run on each lab host (their PID namespaces nest in ours)."""
    found = {h.name: [p for p in h.pids() if proc_env_markers(p)[0] == run_id] for h in lab.hosts}
    return {name: pids for name, pids in found.items() if pids}


@pytest.mark.netns
def test_setup_runs_on_every_host_in_the_synced_workdir_before_the_tasks(lab, tmp_path: Path, home: Path) -> None:
    setup = 'setup:\n  - test -f train.py && echo "ready on $(hostname) in $(pwd)"\n  - python3 --version\n'
    cluster = cluster_file(tmp_path, lab, "sshsetup", "python3 train.py", WORKERS, setup)
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 0, up.stderr
    run_id = json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout)[-1]["run_id"]
    for host in lab.hosts[1:]:
        work = Path(host.home) / ".tfctl" / "work" / run_id
        assert f"] {host.name}         ready on {host.name} in {work}\n" in up.stderr
        assert f"] {host.name}         $ python3 --version\n" in up.stderr
        assert f"] {host.name}         setup done\n" in up.stderr
    assert up.stderr.index("setup done") < up.stderr.index("worker:0     starting")
    assert "[worker:0] training" in up.stdout and "[worker:1] training" in up.stdout


@pytest.mark.netns
def test_a_setup_failing_on_one_host_stops_the_others_and_starts_nothing(lab, tmp_path: Path, home: Path) -> None:
    fails_on_tfh2 = 'if [ "$(hostname)" = tfh2 ]; then echo no such package >&2; exit 5; fi; sleep 60'
    setup = f"setup:\n  - echo starting\n  - '{fails_on_tfh2}'\n"
    cluster = cluster_file(tmp_path, lab, "sshfail", "python3 train.py", WORKERS, setup)
    began = time.monotonic()
    up = tfctl("-f", str(cluster), "up", home=home)
    assert up.returncode == 1
    assert time.monotonic() - began < 40  # tfh1's 60 s sleep was cut short
    assert f"error: setup failed on tfh2: `{fails_on_tfh2}` exited with code 5" in up.stderr
    assert "last 2 lines:\n    starting\n    no such package\n" in up.stderr
    assert "worker:0     starting" not in up.stderr and up.stdout == ""
    run_id = json.loads(tfctl("-f", str(cluster), "runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_pids(lab, run_id) == {}
