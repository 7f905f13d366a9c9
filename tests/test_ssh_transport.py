"""SSHTransport against real OpenSSH servers: the simulated hosts of bench/netns_hosts.py.

No mocks: every test talks to an sshd in its own network namespace. The lab uses its own
prefix/bridge/subnet so it can run while other test modules hold the default lab.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.netns_hosts import SSHD, TestHost, make_lab_fixture
from bench.waiting import wait_until
from tests.conftest import free_ports
from tfctl.errors import HostError
from tfctl.transport import ssh
from tfctl.transport.base import Stream, Transport
from tfctl.transport.ssh import SSHStream, SSHTransport

SUBNET = "10.77.7"
lab = make_lab_fixture(3, scope="module", prefix="tfctl-ssh", bridge="tfctlbr7", subnet=SUBNET)
# Addresses only one neighbour can route to, for ProxyJump: B on tfh1 (reachable from tfh0 only),
# C on tfh2 (reachable from tfh1 only). The other lab hosts have no route to them at all.
HIDDEN_B, HIDDEN_C, HIDDEN_PORT = "10.99.1.1", "10.99.2.2", 2222


@pytest.fixture(autouse=True)
def tfctl_home(tmp_path, monkeypatch) -> Path:
    """A fresh tfctl home per test, so pinned host keys never leak between tests or to ~/.tfctl."""
    home = tmp_path / "tfctl-home"
    monkeypatch.setenv("TFCTL_HOME", str(home))
    return home


@pytest.fixture
def make(lab):
    """SSHTransport factory using the lab's ssh config; closes every transport afterwards."""
    made: list[SSHTransport] = []

    def _make(host: str, **kw) -> SSHTransport:
        kw.setdefault("ssh_config_path", lab.ssh_config)
        made.append(SSHTransport(host, **kw))
        return made[-1]

    yield _make
    for t in made:
        t.close()


def fingerprint(pubkey: Path) -> str:
    """The key's SHA256 fingerprint as OpenSSH prints it (ssh-keygen -l), not as paramiko does."""
    return subprocess.run(
        ["ssh-keygen", "-lf", str(pubkey)], capture_output=True, text=True, check=True
    ).stdout.split()[1]


def host_pub(host: TestHost) -> Path:
    return host.workdir / "ssh_host_ed25519_key.pub"


def known_line(name: str, host: TestHost) -> str:
    kind, b64 = host_pub(host).read_text().split()[:2]
    return f"{name} {kind} {b64}\n"


# -- commands ---------------------------------------------------------------------------------


@pytest.mark.netns
def test_run_returns_stdout_stderr_and_exit_code(make):
    t = make("tfh0")
    r = t.run("hostname; echo oops >&2; exit 3")
    assert (r.host, r.exit_code, r.stdout, r.stderr, r.ok) == ("tfh0", 3, "tfh0\n", "oops\n", False)
    assert t.run("true").ok
    assert t.run("kill -KILL $$").exit_code == -1  # died of a signal; the link is fine


@pytest.mark.netns
def test_one_megabyte_of_stdin_round_trips_through_cat(make):
    data = secrets.token_hex(512 * 1024).encode()  # 1 MiB, text so stdout decodes losslessly
    r = make("tfh0").run("cat", stdin=data, timeout=60)
    assert r.ok and r.stdout.encode() == data


@pytest.mark.netns
def test_large_stderr_does_not_deadlock(make):
    # More than the 2 MiB SSH window, written before any stdout: if stderr were not drained
    # while waiting for stdout, the command would block forever (here: time out).
    r = make("tfh0").run("head -c 4194304 /dev/zero | tr '\\0' e >&2; echo done", timeout=30)
    assert (r.exit_code, r.stdout, len(r.stderr)) == (0, "done\n", 4194304)


@pytest.mark.netns
def test_run_timeout_raises_and_transport_stays_usable(make):
    t = make("tfh0")
    t0 = time.monotonic()
    with pytest.raises(HostError, match="timed out after 0.5s"):
        t.run("sleep 10", timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert t.run("echo still here").stdout == "still here\n"


@pytest.mark.netns
def test_stream_yields_lines_while_the_command_runs(make):
    s = make("tfh1").stream("echo first; sleep 2; echo second; exit 4")
    lines = s.lines()
    t0 = time.monotonic()
    assert next(lines) == "first"
    assert time.monotonic() - t0 < 1.5  # arrived live, not when the command ended
    assert list(lines) == ["second"]
    assert time.monotonic() - t0 > 1.5  # and the rest only once the command printed it
    s.close()
    s.close()  # twice is fine


@pytest.mark.netns
def test_stream_feeds_stdin_and_close_stops_reading(make):
    t = make("tfh1")
    s = t.stream("cat; echo end", stdin="é\nb\n".encode())
    assert list(s.lines()) == ["é", "b", "end"]
    s = t.stream("echo up; sleep 30")
    lines = s.lines()
    assert next(lines) == "up"
    s.close()
    t0 = time.monotonic()
    assert list(lines) == []
    assert time.monotonic() - t0 < 2


@pytest.mark.netns
def test_stream_sends_remote_stderr_to_the_sink(make, capfd):
    got: list[str] = []
    s = make("tfh1", stderr_sink=got.append).stream("echo out; echo 'é err' >&2; sleep 0.5")
    assert list(s.lines()) == ["out"]
    # copied by its own thread
    wait_until(lambda: "".join(got), 2, "the remote stderr at the sink", until=lambda text: text == "é err\n")
    assert "err" not in capfd.readouterr().err
    s = make("tfh1").stream("echo default >&2")  # the default sink: our stderr, as before
    assert list(s.lines()) == []
    err: list[str] = []

    def our_stderr() -> str:
        err.append(capfd.readouterr().err)
        return "".join(err)

    wait_until(our_stderr, 2, "the remote stderr on ours", until=lambda text: "default\n" in text)


@pytest.mark.netns
def test_stream_ends_when_the_link_drops(make, lab):
    host = lab.hosts[2]
    s = make("tfh2", keepalive=1).stream("echo up; sleep 60")
    lines = s.lines()
    assert next(lines) == "up"
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.extend(lines), daemon=True)
    host.set_link(False)
    try:
        t0 = time.monotonic()
        reader.start()
        reader.join(15)  # keepalive 1 s, declared dead after 3 s unacknowledged
        assert not reader.is_alive(), "stream still blocked after the link dropped"
        assert time.monotonic() - t0 < 10
    finally:
        host.set_link(True)
    assert rest == []


@pytest.mark.netns
def test_put_creates_parents_writes_atomically_and_sets_mode(make, lab):
    t = make("tfh0")
    t.put(b"first", "~/x/y/file", 0o640)
    t.put(b"second", "~/x/y/file", 0o600)  # replaces
    t.put(b"spaced", "~/dir with 'quotes' $HOME/f", 0o644)
    r = t.run("stat -c '%a %n' ~/x ~/x/y ~/x/y/file; ls -A ~/x/y; cat ~/x/y/file")
    home = lab.hosts[0].home
    assert r.stdout.splitlines() == [f"700 {home}/x", f"700 {home}/x/y", f"600 {home}/x/y/file", "file", "second"]
    assert Path(home, "dir with 'quotes' $HOME", "f").read_bytes() == b"spaced"


@pytest.mark.netns
def test_concurrent_runs_share_one_connection(make):
    t = make("tfh0")
    results: dict[int, list] = {}
    errors: dict[int, BaseException] = {}

    def work(i: int) -> None:
        try:
            results[i] = [t.run(f"echo {i}-{k} $SSH_CONNECTION") for k in range(5)]
        except BaseException as e:  # noqa: BLE001  (reported below with the thread's own error)
            errors[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == {}
    assert sorted(results) == list(range(8))
    words = [r.stdout.split() for rs in results.values() for r in rs]
    assert sorted(w[0] for w in words) == sorted(f"{i}-{k}" for i in range(8) for k in range(5))
    assert len({tuple(w[1:]) for w in words}) == 1  # one client address and port: one connection


@pytest.mark.netns
@pytest.mark.parametrize("stdin", [None, b"unread input\n"])
def test_late_stdin_eof_keeps_the_connection(make, monkeypatch, stdin):
    """paramiko can send a channel's EOF after the CLOSE it sends in answer to the server's
    (paramiko#1115), and OpenSSH then drops the whole connection with every command on it. Here
    the EOF is held back until a command that does not read its input has long exited."""
    t = make("tfh0")
    before = t.run("echo $SSH_CONNECTION").stdout
    connection = t._clients[-1].get_transport()
    send = connection._send_user_message
    eof_sent = threading.Event()

    def late_eof(message) -> None:
        late = message.asbytes()[0] == 96 and threading.current_thread() is not connection  # CHANNEL_EOF
        if late:
            time.sleep(0.5)  # deliberately: the EOF goes out well after the command has exited
        send(message)
        if late:
            eof_sent.set()

    monkeypatch.setattr(connection, "_send_user_message", late_eof)
    assert t.run("echo quick", stdin=stdin).stdout == "quick\n"
    assert eof_sent.wait(5)
    time.sleep(0.2)  # deliberately: the server's answer to a stray EOF would be to disconnect at once
    assert t.run("echo $SSH_CONNECTION").stdout == before  # the same connection, still up


@pytest.mark.netns
def test_close_then_use_again_reconnects(make):
    t = make("tfh0")
    first = t.run("echo $SSH_CONNECTION").stdout
    t.close()
    second = t.run("echo $SSH_CONNECTION").stdout
    assert first.split()[1] != second.split()[1]  # another client port: a new connection


# -- host keys --------------------------------------------------------------------------------


def direct(make, lab, index: int, known_hosts: list[Path], **kw) -> SSHTransport:
    """A transport to lab host `index` by address, without the lab's known_hosts."""
    host = lab.hosts[index]
    return make(
        host.name,
        destination=host.address,
        user="root",
        identity_file=lab.client_key,
        ssh_config_path=os.devnull,
        known_hosts=known_hosts,
        **kw,
    )


@pytest.mark.netns
def test_unknown_host_key_is_refused_by_default(make, lab, tmp_path, tfctl_home):
    with pytest.raises(HostError) as err:
        direct(make, lab, 1, []).run("true")
    msg = str(err.value)
    assert msg.startswith("tfh1: unknown host key for 10.77.7.11 (ssh-ed25519 ")
    assert fingerprint(host_pub(lab.hosts[1])) in msg
    hint = err.value.hint or ""
    assert "--accept-new-host-keys" in hint and "ssh-keyscan 10.77.7.11" in hint
    assert not (tfctl_home / "known_hosts").exists()


@pytest.mark.netns
def test_accept_new_pins_the_key_then_strict_connects(make, lab, tfctl_home):
    assert direct(make, lab, 1, [], accept_new_host_keys=True).run("hostname").stdout == "tfh1\n"
    pin = tfctl_home / "known_hosts"
    assert pin.read_text() == known_line("10.77.7.11", lab.hosts[1])
    assert stat.S_IMODE(pin.stat().st_mode) == 0o600 and stat.S_IMODE(tfctl_home.stat().st_mode) == 0o700
    assert direct(make, lab, 1, []).run("hostname").stdout == "tfh1\n"  # strict, trusts the pin
    assert pin.read_text() == known_line("10.77.7.11", lab.hosts[1])  # not pinned twice


@pytest.mark.netns
def test_hashed_known_hosts_entries_work(make, lab, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(known_line("10.77.7.12", lab.hosts[2]))
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True)
    assert known.read_text().startswith("|1|")
    assert direct(make, lab, 2, [known]).run("hostname").stdout == "tfh2\n"


@pytest.mark.netns
def test_changed_host_key_is_fatal_even_with_accept_new(make, lab, tmp_path, tfctl_home):
    known = tmp_path / "known_hosts"
    known.write_text(known_line("10.77.7.11", lab.hosts[0]))  # tfh0's key recorded for tfh1
    with pytest.raises(HostError) as err:
        direct(make, lab, 1, [known], accept_new_host_keys=True).run("true")
    msg = str(err.value)
    assert msg.startswith("tfh1: host key for 10.77.7.11 has CHANGED")
    assert fingerprint(host_pub(lab.hosts[0])) in msg and fingerprint(host_pub(lab.hosts[1])) in msg
    assert "ssh-keygen -R '10.77.7.11'" in (err.value.hint or "")
    assert not (tfctl_home / "known_hosts").exists()  # nothing pinned


# -- ssh config, auth, connection errors ---------------------------------------------------------


def write_config(path: Path, lab, alias: str, **options: str) -> Path:
    lines = [f"Host {alias}"] + [f"    {k} {v}" for k, v in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.netns
def test_ssh_config_alias_resolves_hostname_user_port_and_identity(make, lab, tmp_path):
    cfg = write_config(
        tmp_path / "config",
        lab,
        "db-alias",
        HostName="10.77.7.12",
        User="root",
        Port="2",
        IdentityFile=f'"{lab.client_key}"',
        UserKnownHostsFile=f'"{lab.known_hosts}"',
    )
    t = make("worker", destination="db-alias", ssh_config_path=cfg, port=22)  # explicit port wins
    r = t.run("hostname; whoami; echo $SSH_CONNECTION")
    assert r.host == "worker"
    assert r.stdout.split("\n")[:2] == ["tfh2", "root"] and r.stdout.split()[-2:] == ["10.77.7.12", "22"]
    with pytest.raises(
        HostError,
        match=r"cannot reach db-alias \(10.77.7.12:2\): connection refused "
        r"\(is sshd running on port 2\?\)",
    ):
        make("worker", destination="db-alias", ssh_config_path=cfg).run("true")


@pytest.mark.netns
def test_auth_failure_names_user_host_and_keys_tried(make, lab, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* of the machine running the tests
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    stranger = tmp_path / "id_stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    cfg = write_config(
        tmp_path / "config",
        lab,
        "tfh0",
        HostName="10.77.7.10",
        User="root",
        IdentityFile=f'"{stranger}"',
        UserKnownHostsFile=f'"{lab.known_hosts}"',
    )
    with pytest.raises(HostError) as err:
        make("tfh0", ssh_config_path=cfg).run("true")
    msg = str(err.value)
    assert "root@tfh0 (10.77.7.10) refused authentication" in msg
    assert "ssh-agent (0 keys)" in msg and str(stranger) in msg
    hint = err.value.hint or ""
    assert "authorized_keys" in hint and "ssh-copy-id" in hint


@pytest.mark.netns
def test_keys_from_ssh_agent_are_used(make, lab, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, 5, "ssh-agent's socket")
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(lab.client_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        cfg = write_config(
            tmp_path / "config",
            lab,
            "tfh0",
            HostName="10.77.7.10",
            User="root",
            UserKnownHostsFile=f'"{lab.known_hosts}"',
        )  # no IdentityFile
        assert make("tfh0", ssh_config_path=cfg).run("hostname").stdout == "tfh0\n"
    finally:
        agent.kill()
        agent.wait(10)


@pytest.mark.netns
def test_connect_timeout_on_a_pulled_cable(make, lab):
    host = lab.hosts[2]
    host.set_link(False)
    try:
        t0 = time.monotonic()
        with pytest.raises(
            HostError,
            match=r"tfh2: cannot reach tfh2 \(10.77.7.12\): timed out after 2s "
            r"\(firewall or host down\?\)",
        ):
            make("tfh2", connect_timeout=2).run("true")
        assert time.monotonic() - t0 < 4
    finally:
        host.set_link(True)
    assert make("tfh2").run("hostname").stdout == "tfh2\n"


@pytest.mark.netns
def test_unresolvable_name(lab):
    # Inside a lab host: its resolver is unreachable, so no DNS query leaves this machine.
    code = (
        "from tfctl.transport.ssh import SSHTransport\nfrom tfctl.errors import HostError\n"
        "try: SSHTransport('w', destination='no-such-host.invalid', ssh_config_path='/dev/null').run('true')\n"
        "except HostError as e: print(e)"
    )
    out = lab.hosts[0].exec([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.startswith("w: cannot resolve no-such-host.invalid: "), out.stderr


# -- ProxyJump --------------------------------------------------------------------------------


def start_hidden_sshd(host: TestHost, address: str, workdir: Path) -> subprocess.Popen:
    """A second sshd inside `host` (same host key) on `address`, an address only on its lo."""
    host.exec(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    cfg = (host.workdir / "sshd_config").read_text()
    cfg = cfg.replace("Port 22\n", f"Port {HIDDEN_PORT}\n").replace(
        f"ListenAddress {host.address}\n", f"ListenAddress {address}\n"
    )
    (workdir / "sshd_config").write_text(cfg)
    log = workdir / "sshd.log"
    with open(log, "wb") as out:
        proc = host.popen(
            [SSHD, "-D", "-e", "-f", str(workdir / "sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def log_so_far() -> bytes:
        text = log.read_bytes()
        assert b"Server listening on" in text or proc.poll() is None, text.decode(errors="replace")
        return text

    listening = f"the sshd on {address} listening"
    wait_until(log_so_far, 10, listening, until=lambda text: b"Server listening on" in text, interval=0.02)
    return proc


def stop_hidden_sshd(proc: subprocess.Popen) -> None:
    """Kill the sshd by its pid: nsenter's only child (nsenter forks to enter the PID namespace)."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except FileNotFoundError:
        children = []
    for pid in [int(p) for p in children] or [proc.pid]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    proc.wait(10)


@pytest.fixture(scope="module")
def jump_lab(lab, tmp_path_factory):
    """B = sshd on tfh1 at HIDDEN_B, routed only from tfh0; C = sshd on tfh2 at HIDDEN_C, routed
    only from tfh1. Yields the ssh config with aliases for one- and two-hop chains."""
    h0, h1, h2 = lab.hosts
    work = tmp_path_factory.mktemp("jump")
    (work / "b").mkdir()
    (work / "c").mkdir()
    procs = []
    try:
        procs.append(start_hidden_sshd(h1, HIDDEN_B, work / "b"))
        procs.append(start_hidden_sshd(h2, HIDDEN_C, work / "c"))
        h0.exec(["ip", "route", "add", f"{HIDDEN_B}/32", "via", h1.address], check=True)
        h1.exec(["ip", "route", "add", f"{HIDDEN_C}/32", "via", h2.address], check=True)
        known = work / "known_hosts"  # `[host]:port` entries, as OpenSSH writes them for port != 22
        known.write_text(known_line(f"[{HIDDEN_B}]:{HIDDEN_PORT}", h1) + known_line(f"[{HIDDEN_C}]:{HIDDEN_PORT}", h2))
        common = f'    User root\n    IdentityFile "{lab.client_key}"\n    UserKnownHostsFile "{known}"\n'
        (work / "ssh_config").write_text(
            lab.ssh_config.read_text()
            + f"""
Host hidden-b
    HostName {HIDDEN_B}
    Port {HIDDEN_PORT}
{common}
Host hidden-c
    HostName {HIDDEN_C}
    Port {HIDDEN_PORT}
    ProxyJump tfh1
{common}
Host hidden-c2
    HostName {HIDDEN_C}
    Port {HIDDEN_PORT}
    ProxyJump root@tfh0:22,hidden-b
{common}"""
        )
        yield work
    finally:
        for proc in procs:
            stop_hidden_sshd(proc)
        h0.exec(["ip", "route", "del", f"{HIDDEN_B}/32"])
        h1.exec(["ip", "route", "del", f"{HIDDEN_C}/32"])
        h1.exec(["ip", "addr", "del", f"{HIDDEN_B}/32", "dev", "lo"])
        h2.exec(["ip", "addr", "del", f"{HIDDEN_C}/32", "dev", "lo"])


def connect_from(host: TestHost, address: str) -> bool:
    probe = f"import socket; socket.create_connection(({address!r}, {HIDDEN_PORT}), timeout=1)"
    return host.exec([sys.executable, "-c", probe]).returncode == 0


@pytest.mark.netns
def test_hidden_hosts_are_reachable_only_from_their_neighbour(jump_lab, lab):
    # (Not probed from the test process: with its default route the SYN would leave the machine.
    # The SSH_CONNECTION checks below show which host each connection really came from.)
    h0, h1, h2 = lab.hosts
    assert connect_from(h0, HIDDEN_B) and not connect_from(h2, HIDDEN_B)
    assert connect_from(h1, HIDDEN_C) and not connect_from(h0, HIDDEN_C)


@pytest.mark.netns
def test_proxyjump_through_one_hop(make, jump_lab):
    r = make("c", destination="hidden-c", ssh_config_path=jump_lab / "ssh_config").run("hostname; echo $SSH_CONNECTION")
    name, client, _, server, port = r.stdout.split()
    assert (name, client, server, port) == ("tfh2", "10.77.7.11", HIDDEN_C, str(HIDDEN_PORT))  # came from tfh1


@pytest.mark.netns
def test_proxyjump_through_two_hops(make, jump_lab):
    # C is reachable only from tfh1's namespace and B (on tfh1) only from tfh0: the chain must
    # have gone root -> tfh0 -> B -> C.
    b_log = jump_lab / "b" / "sshd.log"
    seen = len(b_log.read_bytes())
    t = make("c", destination="hidden-c2", ssh_config_path=jump_lab / "ssh_config")
    r = t.run("hostname; echo $SSH_CONNECTION")
    name, client, _, server, _ = r.stdout.split()
    assert (name, client, server) == ("tfh2", "10.77.7.11", HIDDEN_C)  # C was entered from tfh1 (B)...
    assert b"Accepted publickey for root from 10.77.7.10" in b_log.read_bytes()[seen:]  # ...B from tfh0
    t.put(b"through two hops", "~/jumped", 0o600)  # and every other call works through the chain
    assert t.run("cat ~/jumped").stdout == "through two hops"
    t.close()
    assert t.run("hostname").stdout == "tfh2\n"  # reconnects the whole chain


@pytest.mark.netns
def test_host_keys_are_checked_on_every_hop(make, jump_lab, lab, tmp_path, tfctl_home):
    h0, h1, h2 = lab.hosts
    cfg = jump_lab / "ssh_config"
    first_hop = known_line("10.77.7.10", h0)
    target = known_line(f"[{HIDDEN_C}]:{HIDDEN_PORT}", h2)
    unknown = tmp_path / "unknown_b"
    unknown.write_text(first_hop + target)  # nothing for B
    with pytest.raises(HostError, match=rf"unknown host key for \[{HIDDEN_B}\]:{HIDDEN_PORT} "):
        make("c", destination="hidden-c2", ssh_config_path=cfg, known_hosts=[unknown]).run("true")
    assert (
        make("c", destination="hidden-c2", ssh_config_path=cfg, known_hosts=[unknown], accept_new_host_keys=True)
        .run("hostname")
        .stdout
        == "tfh2\n"
    )
    assert (tfctl_home / "known_hosts").read_text() == known_line(f"[{HIDDEN_B}]:{HIDDEN_PORT}", h1)

    wrong = tmp_path / "wrong_b"
    wrong.write_text(first_hop + known_line(f"[{HIDDEN_B}]:{HIDDEN_PORT}", h0) + target)
    (tfctl_home / "known_hosts").unlink()
    with pytest.raises(HostError) as err:
        make("c", destination="hidden-c2", ssh_config_path=cfg, known_hosts=[wrong], accept_new_host_keys=True).run(
            "true"
        )
    assert f"host key for [{HIDDEN_B}]:{HIDDEN_PORT} has CHANGED" in str(err.value)
    assert fingerprint(host_pub(h0)) in str(err.value) and fingerprint(host_pub(h1)) in str(err.value)


@pytest.mark.netns
def test_trace_has_one_connect_per_connection_and_a_span_per_command(make, tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TFCTL_TRACE", str(path))
    t = make("tfh0")
    t.run("true")
    t.put(b"x", "~/traced/file")
    list(t.stream("echo hi").lines())
    t.close()
    t.run("true")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "transport.connect",
        "transport.run",
        "transport.run",
        "transport.put",
        "transport.stream",
        "transport.connect",
        "transport.run",
    ]
    assert {e["host"] for e in events} == {"tfh0"} and events[1]["command"] == "true"
    assert events[0]["start"] >= events[1]["start"]  # the handshake happens inside the first command
    assert events[3]["path"] == "~/traced/file" and events[3]["bytes"] == 1


@pytest.mark.netns
def test_connect_makes_the_connection_the_next_command_uses(make, tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TFCTL_TRACE", str(path))
    t = make("tfh0")
    ssh.connect(t)
    ssh.connect(t)  # connected already: nothing to do
    assert t.run("true").ok
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == [
        "transport.connect",
        "transport.run",
    ]


def test_connect_fails_as_a_command_would(tmp_path):
    port = free_ports(1)[0]  # nothing listens there
    t = SSHTransport("nowhere", destination="127.0.0.1", port=port, ssh_config_path=tmp_path / "no-config")
    with pytest.raises(HostError, match=f"127.0.0.1:{port}\\): connection refused"):
        ssh.connect(t)


# -- the interface ----------------------------------------------------------------------------


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_every_transport_has_exactly_the_transport_interface():
    from tfctl.backends.slurm.transport import SlurmTransport
    from tfctl.transport.local import LocalStream, LocalTransport

    for transport in (SSHTransport, LocalTransport, SlurmTransport):
        assert public(transport) == public(Transport), transport
    for stream in (SSHStream, LocalStream):
        assert public(stream) == public(Stream), stream


def test_only_ssh_module_imports_paramiko_and_only_when_used():
    root = Path(__file__).resolve().parents[1] / "tfctl"
    importers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if any(line.strip().startswith(("import paramiko", "from paramiko")) for line in p.read_text().splitlines())
    )
    assert importers == ["transport/ssh.py"]
    probe = "import sys, tfctl.cli, tfctl.transport; print('paramiko' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root.parent)
    assert out.stdout.strip() == "False", out.stderr
