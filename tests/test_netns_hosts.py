"""The simulated SSH hosts (bench/netns_hosts.py) behave like separate machines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TypedDict

import pytest

from bench.netns_hosts import (
    LabError,
    TestHostLab,
    cleanup_leftovers,
    make_lab_fixture,
    require_netns,
    skip_reason,
)
from bench.waiting import wait_until

pytestmark = pytest.mark.netns

lab3 = make_lab_fixture(3, scope="module")


@pytest.fixture(autouse=True)
def _needs_netns():
    require_netns()  # for the tests that build their own lab


class LabNames(TypedDict):
    prefix: str
    bridge: str
    subnet: str


# A second, independent lab must not clash with the module's lab (default prefix/bridge/subnet).
OTHER = LabNames(prefix="tfctl-tx", bridge="tfctlbr9", subnet="10.77.9")


def _netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _connect_error(address: str, port: int, timeout: float) -> str | None:
    """None if a TCP connect succeeds, else the error's type name."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None
    except OSError as exc:
        return type(exc).__name__


# ------------------------------------------------------------------------------------------


def test_hostname_over_ssh_is_the_host_name(lab3):
    for host in lab3.hosts:
        res = subprocess.run(
            ["ssh", "-F", str(lab3.ssh_config), host.name, "hostname"], capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == host.name
    # the address works as a Host alias too, with strict host key checking
    res = lab3.ssh(lab3.hosts[2].address, "hostname")
    assert (res.returncode, res.stdout.strip()) == (0, "tfh2"), res.stderr


def test_hosts_have_their_own_address_and_no_default_route(lab3):
    assert [h.name for h in lab3.hosts] == ["tfh0", "tfh1", "tfh2"]
    assert [h.address for h in lab3.hosts] == ["10.77.0.10", "10.77.0.11", "10.77.0.12"]
    for host in lab3.hosts:
        assert host.exec(["hostname"]).stdout.strip() == host.name
        addrs = host.exec(["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
        assert f"inet {host.address}/24" in addrs
        routes = host.exec(["ip", "route"]).stdout
        assert "default" not in routes, routes


def test_host_reaches_other_host_by_address_and_name(lab3):
    h0, h1 = lab3.hosts[0], lab3.hosts[1]
    probe = textwrap.dedent(f"""
        import socket
        with socket.create_connection(({h0.address!r}, 22), timeout=5) as s:
            print(s.recv(64).decode().strip())
        print(socket.gethostbyname("tfh0"))
    """)
    res = h1.exec([sys.executable, "-c", probe])
    assert res.returncode == 0, res.stderr
    banner, resolved = res.stdout.split("\n")[:2]
    assert banner.startswith("SSH-2.0-OpenSSH")
    assert resolved == h0.address  # the hosts file is /etc/hosts inside every host
    # and ssh from inside host 1 to host 0 lands on host 0
    res = h1.exec(["ssh", "-F", str(lab3.ssh_config), "tfh0", "hostname"])
    assert (res.returncode, res.stdout.strip()) == (0, "tfh0"), res.stderr


def test_process_on_one_host_is_invisible_on_another(lab3):
    h0, h1 = lab3.hosts[0], lab3.hosts[1]
    before = set(h0.pids())
    nsenter = h0.popen(["sleep", "4242.5"])
    try:
        wait_until(lambda: "sleep 4242.5" in h0.exec(["ps", "-eo", "args"]).stdout, 5, "the sleep in tfh0's ps")
        ps1 = h1.exec(["ps", "-eo", "pid,args"]).stdout
        assert "sleep 4242.5" not in ps1
        # in its own PID namespace, sshd is PID 1
        assert ps1.splitlines()[1].split(None, 1)[0] == "1" and "sshd" in ps1.splitlines()[1]
        new = set(h0.pids()) - before
        assert len(new) == 1
        (sleep_pid,) = new
        assert Path(f"/proc/{sleep_pid}/cmdline").read_bytes() == b"sleep\x004242.5\x00"
        assert sleep_pid not in h1.pids()
    finally:
        for pid in set(h0.pids()) - before:
            os.kill(pid, signal.SIGKILL)
        nsenter.wait(timeout=10)


def test_same_port_can_be_bound_on_two_hosts(lab3):
    server = textwrap.dedent("""
        import socket, sys
        s = socket.socket()
        s.bind(("", 2222))          # *:2222, like a TF server
        s.listen()
        print("listening", flush=True)
        c, _ = s.accept()
        c.sendall(socket.gethostname().encode())
        c.close()
    """)
    servers = [h.popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True) for h in lab3.hosts[:2]]
    try:
        for proc in servers:
            assert proc.stdout.readline().strip() == "listening"
        for host in lab3.hosts[:2]:
            with socket.create_connection((host.address, 2222), timeout=5) as conn:
                assert conn.recv(64).decode() == host.name
        for proc in servers:
            assert proc.wait(timeout=10) == 0
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def test_set_link_cuts_the_host_off_and_back(lab3):
    h1, h2 = lab3.hosts[1], lab3.hosts[2]
    assert h2.is_reachable()
    h2.set_link(False)
    try:
        t0 = time.monotonic()
        err = _connect_error(h2.address, 22, timeout=1.0)
        assert err in ("TimeoutError", "timeout", "OSError"), err  # nothing answers, no RST
        assert time.monotonic() - t0 < 3
        probe = f"import socket; socket.create_connection(({h2.address!r}, 22), timeout=1)"
        assert h1.exec([sys.executable, "-c", probe]).returncode != 0
    finally:
        h2.set_link(True)
    h2.wait_port(timeout=10)
    res = lab3.ssh(h2, "hostname")
    assert (res.returncode, res.stdout.strip()) == (0, "tfh2"), res.stderr


def test_hosts_have_their_own_home_and_machine_id_by_default(lab3):
    assert lab3.home_mode == "own"
    h0, h1 = lab3.hosts[0], lab3.hosts[1]
    assert len({h.home for h in lab3.hosts}) == 3
    res = lab3.ssh(h0, "echo $HOME; echo written-on-$(hostname) > ~/home-probe")
    assert (res.returncode, res.stdout.strip()) == (0, h0.home), res.stderr
    try:
        res = lab3.ssh(h1, "echo $HOME; cat ~/home-probe")
        assert res.stdout.splitlines() == [h1.home]  # tfh0's file is not in tfh1's ~
        assert res.returncode != 0
    finally:
        Path(h0.home, "home-probe").unlink()
    # each host has a machine id of its own, not the root namespace's
    ids = [lab3.ssh(h, "cat /etc/machine-id").stdout.strip() for h in lab3.hosts]
    assert ids == [h.machine_id for h in lab3.hosts]
    if Path("/etc/machine-id").is_file():
        assert len(set(ids)) == 3 and all(len(i) == 32 for i in ids)
        assert Path("/etc/machine-id").read_text().strip() not in ids


def test_shared_home_is_one_home_for_every_host(tmp_path):
    with TestHostLab(3, workdir=tmp_path, shared_home=True, **OTHER) as lab:
        assert lab.home_mode == "shared"
        shared = str(tmp_path / "shared-home")
        assert [h.home for h in lab.hosts] == [shared] * 3
        h0, h1, h2 = lab.hosts
        res = lab.ssh(h0, "echo $HOME; echo written-on-$(hostname) > ~/home-probe")
        assert (res.returncode, res.stdout.strip()) == (0, shared), res.stderr
        for other in (h1, h2):
            res = lab.ssh(other, "echo $HOME; hostname; cat ~/home-probe")
            assert res.returncode == 0, res.stderr
            assert res.stdout.splitlines() == [shared, other.name, "written-on-tfh0"]
        # still separate machines: own hostname and machine id, and strict host keys still work
        assert len({h.machine_id for h in lab.hosts}) == (3 if Path("/etc/machine-id").is_file() else 1)
        res = h2.exec(["ssh", "-F", str(lab.ssh_config), "tfh1", "hostname"])
        assert (res.returncode, res.stdout.strip()) == (0, "tfh1"), res.stderr
    with pytest.raises(ValueError, match="shared_home needs isolate_home"):
        TestHostLab(1, shared_home=True, isolate_home=False, **OTHER)


def test_closed_lab_leaves_nothing_behind(tmp_path):
    lab = TestHostLab(2, workdir=tmp_path, **OTHER)
    with lab:
        netns = [h.netns for h in lab.hosts]
        veths = [h.veth for h in lab.hosts]
        assert set(netns) <= set(_netns_names())
        assert _link_exists("tfctlbr9")
        sleeper = lab.hosts[0].popen(["sleep", "600"])  # dies with its host
        wait_until(lambda: "sleep 600" in lab.hosts[0].exec(["ps", "-eo", "args"]).stdout, 5, "the sleep in tfh0's ps")
        # Each host's processes now, but a process ending as the test looks (CI saw one): the
        # sleep's own end is proven below, by its nsenter.
        pids = [pid for h in lab.hosts for pid in h.pids() if _pid_alive(pid)]
        unshares = [st.proc for st in lab._states]  # the unshare parents we started
        assert len(unshares) == 2 and all(p is not None and _pid_alive(p.pid) for p in unshares)
        pids += [proc.pid for proc in unshares if proc is not None]
        assert len(pids) >= 5
    assert not set(netns) & set(_netns_names())
    assert not _link_exists("tfctlbr9")
    assert not any(_link_exists(v) for v in veths)
    assert [p for p in pids if _pid_alive(p)] == []
    assert sleeper.wait(timeout=5) != 0  # its nsenter saw the sleep killed
    lab.close()  # idempotent


def test_rerun_after_a_crash_cleans_up_the_leftovers(tmp_path):
    """A process that dies without closing its lab (die_with_parent=False, so its sshds survive)
    must not stop the next lab with the same prefix from starting."""
    crash = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})  # the repo root: bench is a package
        from bench.netns_hosts import TestHostLab
        lab = TestHostLab(2, workdir={str(tmp_path / "crashed")!r}, die_with_parent=False,
                          **{OTHER!r})
        lab.start()
        print(json.dumps([h.init_pid for h in lab.hosts]), flush=True)
        os._exit(3)   # no close(), no atexit
    """)
    res = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    orphans = json.loads(res.stdout)
    assert all(_pid_alive(p) for p in orphans)
    assert {"tfctl-tx-tfh0", "tfctl-tx-tfh1"} <= set(_netns_names())

    with TestHostLab(1, workdir=tmp_path / "rerun", **OTHER) as lab:
        assert not any(_pid_alive(p) for p in orphans)  # killed by pid
        assert "tfctl-tx-tfh1" not in _netns_names()
        assert lab.ssh(lab.hosts[0], "hostname").stdout.strip() == "tfh0"
    assert not any(n.startswith("tfctl-tx-") for n in _netns_names())
    assert not _link_exists("tfctlbr9")
    # nothing left, so an explicit cleanup finds nothing to remove
    assert cleanup_leftovers(OTHER["prefix"], OTHER["bridge"]) == {"pids": [], "netns": [], "links": []}


def test_second_lab_with_a_busy_prefix_is_refused(lab3, tmp_path):
    with pytest.raises(LabError, match="another test host lab"):
        TestHostLab(1, workdir=tmp_path, lock_timeout=0).start()
    assert lab3.hosts[0].is_reachable()  # the running lab was not touched


def test_sshd_failure_is_reported_with_its_log(tmp_path, monkeypatch):
    lab = TestHostLab(1, workdir=tmp_path, **OTHER)
    orig = lab._write_sshd_config

    def broken(st):
        orig(st)
        with open(st.dir / "sshd_config", "a") as f:
            f.write("NoSuchSshdOption yes\n")

    monkeypatch.setattr(lab, "_write_sshd_config", broken)
    with pytest.raises(LabError, match="(?s)sshd exited.*NoSuchSshdOption"):
        lab.start()
    assert not any(n.startswith("tfctl-tx-") for n in _netns_names())
    assert not _link_exists("tfctlbr9")


def test_require_netns_skips_or_fails(monkeypatch):
    assert skip_reason() is None  # the autouse fixture let us get here
    monkeypatch.setattr("bench.netns_tools.skip_reason", lambda: "no netns here")
    monkeypatch.delenv("TFCTL_REQUIRE_NETNS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no netns here"):
        require_netns()
    monkeypatch.setenv("TFCTL_REQUIRE_NETNS", "1")
    with pytest.raises(pytest.fail.Exception, match="no netns here"):
        require_netns()
