"""Simulated hosts for SSH integration tests and benchmarks: real OpenSSH servers in network namespaces.

Each simulated host is

* a network namespace ``<prefix>-<name>`` (e.g. ``tfctl-t-tfh0``) holding ``lo`` and ``eth0``
  (one end of a veth pair; the other end, ``<prefix>-v<i>``, is a port of the bridge
  ``tfctlbr0`` in the root namespace), address ``<subnet>.<10+i>/24`` and NO default route: a
  host reaches the other hosts and the root namespace (``<subnet>.1``, called ``tfctl-root`` in
  the hosts' ``/etc/hosts``) and nothing else;
* inside that, ``unshare --uts --pid --fork --mount-proc``: its own hostname (= its name), its own
  PID namespace (``ps`` shows only its processes; killing the namespace init kills everything on
  the host) and its own mount namespace, where the lab's hosts file is bind-mounted over
  ``/etc/hosts`` so hosts resolve each other by name (what TF's gRPC needs), and a per-host
  machine id is bind-mounted over ``/etc/machine-id`` (and ``/var/lib/dbus/machine-id``) where
  those exist, since no two real machines share one;
* as PID 1 of that PID namespace, ``sshd -D -e`` with a generated config and host key, listening
  on the host address port 22.

The file system is shared with the root namespace (same paths everywhere), but every SSH session
gets ``HOME=<workdir>/<name>/home`` (see ``isolate_home``) so root's ``~/.bashrc`` (pyenv init:
~0.25 s per command here) does not run for every command and ``~`` differs per host, and ``PATH``
starts with the directory of the interpreter running the tests, so ``python3`` over SSH is the
test interpreter. With ``shared_home=True`` every host's SSH sessions get the same
``HOME=<workdir>/shared-home`` instead, as on clusters whose home directories are on NFS (the
lab's keys, known_hosts and ssh config live in ``<workdir>``, not under any HOME, so nothing
per-host is kept in the shared one).

Usage::

    from bench.netns_hosts import TestHostLab, skip_reason
    with TestHostLab(3, workdir=tmp_path) as lab:   # shared_home=True: one HOME for all hosts
        h0 = lab.hosts[0]                       # TestHost(name="tfh0", address="10.77.0.10", ...)
        subprocess.run(["ssh", "-F", lab.ssh_config, "tfh0", "hostname"])   # -> tfh0
        h0.exec(["ps", "-e"])                  # runs inside the host
        h0.set_link(False)                      # cable pulled

pytest (in a test module or ``tests/conftest.py``; pytest puts the repo root on ``sys.path``
because ``tests/`` is a package)::

    from bench.netns_hosts import make_lab_fixture
    netns_lab = make_lab_fixture(3)          # session-scoped fixture named "netns_lab"
    netns_lab16 = make_lab_fixture(16, scope="module")

    @pytest.mark.netns
    def test_x(netns_lab): ...

The fixture skips the test when the lab cannot run here (see ``skip_reason``), or fails it when
``TFCTL_REQUIRE_NETNS=1``. Only one lab per ``prefix`` may exist at a time on the machine (an
advisory lock in /run/lock enforces it; a second one waits ``lock_timeout`` seconds and fails);
labs that should coexist need distinct ``prefix``, ``bridge`` and ``subnet``. Starting a lab first
removes leftovers of a crashed earlier run with the same prefix/bridge (``cleanup_leftovers``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, Mapping, Sequence

from bench.netns_tools import (
    DEFAULT_BRIDGE,
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    IFNAMSIZ,
    ROOT_NS_NAME,
    SSHD,
    LabError,
    _children,
    _cleanup,
    _die_with_parent,
    _ip_batch,
    _kill_pids,
    _link_exists,
    _Lock,
    _netns_list,
    _netns_pids,
    _pid_ns,
    _read_bytes,
    _run,
    _tail,
    _tcp_connect,
    _wait_links_gone,
    cleanup_leftovers,
    require_netns,
    skip_reason,
)
from bench.waiting import WaitTimeout, wait_until

__all__ = [
    "DEFAULT_BRIDGE",
    "DEFAULT_PREFIX",
    "DEFAULT_SUBNET",
    "LabError",
    "TestHost",
    "TestHostLab",
    "cleanup_leftovers",
    "make_lab_fixture",
    "require_netns",
    "skip_reason",
]

_HOST_INIT = r"""set -e
ip addr add "$1/24" dev eth0
ip link set lo up
ip link set eth0 up
hostname "$2"
mount --bind "$3" /etc/hosts
for f in /etc/machine-id /var/lib/dbus/machine-id; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then mount --bind "$6" "$f"; fi
done
exec "$4" -D -e -f "$5"
"""


@dataclass(frozen=True)
class TestHost:
    """One simulated host (valid while its lab is open)."""

    __test__ = False  # not a pytest test class

    name: str  # also its hostname, e.g. "tfh0"
    address: str  # e.g. "10.77.0.10"
    netns: str  # e.g. "tfctl-t-tfh0"
    sshd_port: int = 22
    veth: str = field(default="", compare=False)  # root-namespace end of its link (bridge port)
    init_pid: int = field(default=0, compare=False)  # sshd = PID 1 in the host (root-ns pid)
    home: str = field(default="", compare=False)  # HOME of its SSH sessions (one for all hosts if shared)
    machine_id: str = field(default="", compare=False)  # its /etc/machine-id ("" if the system has none)
    workdir: Path = field(default=Path("."), compare=False)  # sshd config, host key, log

    @property
    def sshd_log(self) -> Path:
        return self.workdir / "sshd.log"

    def inside(self, argv: Sequence[str] | str, cwd: str | os.PathLike | None = None) -> list[str]:
        """The command line that runs `argv` inside the host (with the caller's environment)."""
        if isinstance(argv, str):
            argv = ["/bin/sh", "-c", argv]
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        return ["nsenter", f"--target={self.init_pid}", "--net", "--uts", "--pid", "--mount", f"--wd={wd}", "--", *argv]

    def exec(self, argv: Sequence[str] | str, **kw) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside the host (its net, uts, pid and mount namespaces).

        A str is run with /bin/sh -c. Defaults: capture_output=True, text=True, timeout=60;
        `cwd` is honoured (default: the caller's cwd). Environment is the caller's, not SSH's.
        """
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(self.inside(argv, kw.pop("cwd", None)), **kw)

    def popen(self, argv: Sequence[str] | str, **kw) -> subprocess.Popen:
        """subprocess.Popen(argv) inside the host; the returned pid is nsenter's (outside)."""
        return subprocess.Popen(self.inside(argv, kw.pop("cwd", None)), **kw)

    def set_link(self, up: bool) -> None:
        """Pull (False) or plug back (True) the host's network cable (its bridge port).

        While down, nothing reaches the host (connects time out), and the host reaches nothing
        but itself.
        """
        _run(["ip", "link", "set", self.veth, "up" if up else "down"])

    def pids(self) -> list[int]:
        """Root-namespace pids of all processes in the host's PID namespace."""
        target = _pid_ns(self.init_pid)
        if target is None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _pid_ns(int(entry)) == target:
                found.append(int(entry))
        return sorted(found)

    def signal_all(self, number: int) -> None:
        """Every process of the host (its sshd, supervisor, monitors and tasks): SIGSTOP freezes
        it as a paused VM or a hung NFS server would, SIGCONT thaws it."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)

    def is_reachable(self, port: int | None = None, timeout: float = 0.5) -> bool:
        """Does a TCP connect from the root namespace to address:port succeed within timeout?"""
        return _tcp_connect(self.address, port or self.sshd_port, timeout)

    def wait_port(self, port: int | None = None, timeout: float = 10.0) -> None:
        """Wait until address:port accepts TCP from the root namespace (LabError on timeout)."""
        where = f"{self.name} {self.address}:{port or self.sshd_port}"
        try:
            wait_until(lambda: self.is_reachable(port, timeout=0.3), timeout, f"{where} reachable")
        except WaitTimeout:
            raise LabError(f"{where} not reachable after {timeout}s") from None


@dataclass
class _HostState:  # mutable bookkeeping while creating / removing
    index: int
    name: str
    address: str
    netns: str
    veth: str
    dir: Path
    proc: subprocess.Popen | None = None
    log: IO[bytes] | None = None
    init_pid: int = 0
    pidfd: int | None = None


class TestHostLab:
    """`n` simulated hosts `<name_prefix>0..n-1` on `<subnet>.0/24`; a context manager.

    Host i is `<name_prefix><i>` at `<subnet>.<10+i>`. Attributes once started: `hosts` (list
    of TestHost), `ssh_config`, `known_hosts` (entries `tfh0,10.77.0.10 ssh-ed25519 ...`, so
    paramiko can use it too), `client_key` (private key path; `.pub` next to it),
    `authorized_keys`, `hosts_file` (bind-mounted as /etc/hosts in every host), `gateway` (the
    root namespace's address on the bridge), `workdir`, `timings` (`{"create": s, "destroy": s}`).

    Options: `workdir` (default: a temp dir removed on close; a given one is kept),
    `prefix`/`bridge`/`subnet` (must all differ for labs that run at the same time),
    `start_timeout` (for every sshd to accept TCP), `lock_timeout` (wait for another lab with the
    same prefix to finish), `isolate_home` (SSH sessions get HOME=<workdir>/<name>/home instead
    of /root: no ~/.bashrc per command, separate ~ per host), `shared_home` (with isolate_home:
    every host's SSH sessions get the same HOME=<workdir>/shared-home, like an NFS home; see
    `home_mode`), `path_prepend` (front of PATH in
    SSH sessions; default: the directory of sys.executable), `session_env` (more variables of SSH
    sessions, `{host}` in a value replaced by the host's name: e.g. its own podman configuration),
    `die_with_parent` (PR_SET_PDEATHSIG:
    the hosts' processes die if the *thread* that started the lab dies; keep it on unless the lab
    is started from a short-lived thread).
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        n: int,
        subnet: str = DEFAULT_SUBNET,
        workdir: str | os.PathLike | None = None,
        *,
        name_prefix: str = "tfh",
        prefix: str = DEFAULT_PREFIX,
        bridge: str = DEFAULT_BRIDGE,
        start_timeout: float = 30.0,
        lock_timeout: float = 60.0,
        isolate_home: bool = True,
        shared_home: bool = False,
        path_prepend: Sequence[str] | None = None,
        session_env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        octets = subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets):
            raise ValueError(f"subnet must be three octets like '10.77.0', got {subnet!r}")
        if not 1 <= n <= 240:
            raise ValueError("n must be between 1 and 240")
        if len(f"{prefix}-v{n - 1}") > IFNAMSIZ or len(bridge) > IFNAMSIZ:
            raise ValueError("prefix/bridge too long for interface names (15 chars)")
        if shared_home and not isolate_home:
            raise ValueError("shared_home needs isolate_home (without it every host's HOME is /root anyway)")
        self.n = n
        self.subnet = subnet
        self.gateway = f"{subnet}.1"
        self.name_prefix = name_prefix
        self.prefix = prefix
        self.bridge = bridge
        self.start_timeout = start_timeout
        self.lock_timeout = lock_timeout
        self.isolate_home = isolate_home
        self.shared_home = shared_home
        self.path_prepend = list(path_prepend) if path_prepend is not None else [os.path.dirname(sys.executable)]
        self.session_env = dict(session_env or {})
        self.die_with_parent = die_with_parent
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.hosts: list[TestHost] = []
        self.timings: dict[str, float] = {}
        self._states = [
            _HostState(
                i, f"{name_prefix}{i}", f"{subnet}.{10 + i}", f"{prefix}-{name_prefix}{i}", f"{prefix}-v{i}", Path()
            )
            for i in range(n)
        ]
        self._lock = _Lock(prefix)
        self._net_touched = False
        self._started = False
        self._closed = False

    # -- paths
    @property
    def _root(self) -> Path:
        """The workdir: given, or made by start()."""
        if self.workdir is None:
            raise LabError("the lab has no workdir before start()")
        return self.workdir

    @property
    def ssh_config(self) -> Path:
        return self._root / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self._root / "known_hosts"

    @property
    def client_key(self) -> Path:
        return self._root / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self._root / "authorized_keys"

    @property
    def hosts_file(self) -> Path:
        return self._root / "hosts"

    @property
    def home_mode(self) -> str:
        """ "own" (a HOME per host), "shared" (one HOME for all, as with NFS) or "root" (/root)."""
        return "root" if not self.isolate_home else "shared" if self.shared_home else "own"

    def _home_of(self, st: _HostState) -> Path:
        """HOME of a host's SSH sessions (only meaningful with isolate_home)."""
        return self._root / "shared-home" if self.shared_home else st.dir / "home"

    # -- conveniences
    def host(self, key: int | str) -> TestHost:
        if isinstance(key, int):
            return self.hosts[key]
        for h in self.hosts:
            if key in (h.name, h.address):
                return h
        raise KeyError(key)

    def ssh_argv(self, host: TestHost | str, *command: str) -> list[str]:
        """argv for running `command` on `host` with the system ssh client and the lab config."""
        name = host.name if isinstance(host, TestHost) else host
        return ["ssh", "-F", str(self.ssh_config), name, *command]

    def ssh(self, host: TestHost | str, *command: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(self.ssh_argv(host, *command), **kw)

    def pdsh_env(self) -> dict[str, str]:
        """Environment for `pdsh -w tfh[0-2] cmd` through the lab's ssh config."""
        return {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {self.ssh_config} %h"}

    # -- lifecycle
    def __enter__(self) -> "TestHostLab":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "TestHostLab":
        if self._started:
            raise LabError("lab already started")
        self._started = True
        t0 = time.monotonic()
        atexit.register(self.close)
        try:
            self._start()
        except BaseException as exc:
            try:
                self.close()
            except Exception as close_exc:  # noqa: BLE001 - keep the original error; mention the second
                if hasattr(exc, "add_note"):
                    exc.add_note(f"lab cleanup after the failure also failed: {close_exc}")
            raise
        self.timings["create"] = time.monotonic() - t0
        return self

    def _start(self) -> None:
        self._lock.acquire(self.lock_timeout)
        _cleanup(self.prefix, self.bridge)
        self._check_subnet_free()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-lab-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep dir
        for st in self._states:
            st.dir = self.workdir / st.name
            st.dir.mkdir(parents=True, exist_ok=True)
            if self.isolate_home:
                self._home_of(st).mkdir(parents=True, exist_ok=True)
            (st.dir / "machine-id").write_text(uuid.uuid4().hex + "\n")
        self._make_keys_and_configs()
        self._make_network()
        self._spawn_hosts()
        self._wait_ready()
        machine_ids = self._read_machine_ids()
        self.hosts = [
            TestHost(
                st.name,
                st.address,
                st.netns,
                22,
                veth=st.veth,
                init_pid=st.init_pid,
                home=str(self._home_of(st)) if self.isolate_home else "/root",
                machine_id=machine_ids[st.name],
                workdir=st.dir,
            )
            for st in self._states
        ]

    def _read_machine_ids(self) -> dict[str, str]:
        """Each host's /etc/machine-id as seen inside it (its own, bind-mounted; "" if none)."""
        ids = {}
        for st in self._states:
            path = f"/proc/{st.init_pid}/root/etc/machine-id"  # the host's mount namespace
            try:
                ids[st.name] = Path(path).read_text().strip()
            except OSError:
                ids[st.name] = ""
        return ids

    def _check_subnet_free(self) -> None:
        out = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
        for line in out.splitlines():
            parts = line.split()
            if "inet" in parts:
                addr = parts[parts.index("inet") + 1]
                if addr.rsplit(".", 1)[0] == self.subnet:
                    raise LabError(f"subnet {self.subnet}.0/24 already in use: {line.strip()}")
        if _run(["ip", "-4", "route", "show", f"{self.subnet}.0/24"], check=False).stdout.strip():
            raise LabError(f"a route for {self.subnet}.0/24 already exists")

    def _make_keys_and_configs(self) -> None:
        jobs = [(self.client_key, "tfctl-lab-client")]
        jobs += [(st.dir / "ssh_host_ed25519_key", st.name) for st in self._states]
        procs = []
        for path, comment in jobs:
            for p in (path, path.with_suffix(".pub")):
                if p.exists():
                    p.unlink()
            procs.append(
                subprocess.Popen(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        for proc, (path, _) in zip(procs, jobs):
            out = proc.communicate(timeout=30)[0]
            if proc.returncode != 0:
                raise LabError(f"ssh-keygen for {path} failed: {out.decode(errors='replace')}")
        pub = Path(str(self.client_key) + ".pub").read_text()
        self.authorized_keys.write_text(pub)

        known, cfg = [], []
        hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{self.gateway}\t{ROOT_NS_NAME}"]
        for st in self._states:
            key = (st.dir / "ssh_host_ed25519_key.pub").read_text().split()
            known.append(f"{st.name},{st.address} {key[0]} {key[1]}")
            hosts.append(f"{st.address}\t{st.name}")
            cfg += [
                f"Host {st.name} {st.address}",
                f"    HostName {st.address}",
                "    Port 22",
                "    User root",
                f'    IdentityFile "{self.client_key}"',
                "    IdentitiesOnly yes",
                f'    UserKnownHostsFile "{self.known_hosts}"',
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    ConnectTimeout 5",
                # The key exchange paramiko (tfctl) negotiates with this sshd. OpenSSH 9's default,
                # sntrup761x25519, costs the client ~0.1 CPU-second per connection: with it, pdsh
                # on 16 hosts sharing 2 cores takes ~1.5 s instead of ~0.55 s.
                "    KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
                "    LogLevel ERROR",
                "",
            ]
            self._write_sshd_config(st)
        self.known_hosts.write_text("\n".join(known) + "\n")
        self.ssh_config.write_text("\n".join(cfg))
        self.hosts_file.write_text("\n".join(hosts) + "\n")

    def _write_sshd_config(self, st: _HostState) -> None:
        env = []
        if self.isolate_home:
            env.append(f"HOME={self._home_of(st)}")
        if self.path_prepend:
            std = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            env.append("PATH=" + ":".join([*self.path_prepend, std]))
        env += [f"{key}={value.format(host=st.name)}" for key, value in sorted(self.session_env.items())]
        lines = [
            "Port 22",
            f"ListenAddress {st.address}",
            f'HostKey "{st.dir / "ssh_host_ed25519_key"}"',
            "PidFile none",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            f'AuthorizedKeysFile "{self.authorized_keys}"',
            "Subsystem sftp internal-sftp",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "X11Forwarding no",
            "LoginGraceTime 30",
            *([f"SetEnv {' '.join(chr(34) + e + chr(34) for e in env)}"] if env else []),
        ]  # no AcceptEnv: clients cannot push environment variables
        (st.dir / "sshd_config").write_text("\n".join(lines) + "\n")

    def _make_network(self) -> None:
        self._net_touched = True  # from here on close() must delete namespaces and links
        lines = [
            f"link add {self.bridge} type bridge",
            f"addr add {self.gateway}/24 dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for st in self._states:
            lines += [
                f"netns add {st.netns}",
                f"link add {st.veth} type veth peer name eth0 netns {st.netns}",
                f"link set {st.veth} master {self.bridge} up",
            ]
        _ip_batch(lines, force=False)

    def _spawn_hosts(self) -> None:
        # Popen from this thread on purpose: PR_SET_PDEATHSIG fires when the *thread* that
        # forked exits.
        for st in self._states:
            st.log = open(st.dir / "sshd.log", "wb")
            argv = [
                "ip",
                "netns",
                "exec",
                st.netns,  # execs (no fork) into unshare
                "unshare",
                "--uts",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "--",
                "/bin/sh",
                "-c",
                _HOST_INIT,
                "host-init",
                st.address,
                st.name,
                str(self.hosts_file),
                SSHD,
                str(st.dir / "sshd_config"),
                str(st.dir / "machine-id"),
            ]
            st.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=st.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no terminal SIGINT straight to the hosts
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )

    def _wait_ready(self) -> None:
        pending = list(self._states)

        def all_ready() -> bool:
            for st in list(pending):
                assert st.proc is not None  # started by _spawn_hosts
                if st.proc.poll() is not None:
                    raise LabError(
                        f"{st.name}: sshd exited with {st.proc.returncode} before "
                        f"accepting connections; log {st.dir / 'sshd.log'}:\n"
                        f"{_tail(st.dir / 'sshd.log')}"
                    )
                # Probe TCP only once sshd says it listens: by then eth0 is up. An earlier probe
                # would send an ARP request into a link that is still down, and the kernel
                # retries ARP only after 1 s (costing ~1 s per lab).
                if b"Server listening on" in _read_bytes(st.dir / "sshd.log") and _tcp_connect(st.address, 22, 0.5):
                    self._find_init(st)
                    pending.remove(st)
            return not pending

        try:
            wait_until(all_ready, self.start_timeout, "every sshd accepting TCP", interval=0.02)
        except WaitTimeout:
            st = pending[0]
            raise LabError(
                f"{len(pending)} host(s) ({', '.join(s.name for s in pending)}) not accepting "
                f"TCP on port 22 after {self.start_timeout}s; log of {st.name}:\n"
                f"{_tail(st.dir / 'sshd.log')}"
            ) from None

    def _find_init(self, st: _HostState) -> None:
        assert st.proc is not None  # started by _spawn_hosts
        kids = _children(st.proc.pid)
        if len(kids) != 1:
            raise LabError(f"{st.name}: expected one child of unshare {st.proc.pid}, got {kids}")
        st.init_pid = kids[0]
        if hasattr(os, "pidfd_open"):
            try:  # a pidfd keeps the kill below safe against pid reuse
                st.pidfd = os.pidfd_open(st.init_pid)
            except OSError:
                st.pidfd = None

    def close(self) -> None:
        """Kill every process on every host, delete namespaces, links and the bridge.

        Idempotent; safe after a partial start. Raises LabError if something survived.
        """
        if self._closed:
            return
        t0 = time.monotonic()
        errors: list[str] = []
        # 1. processes: SIGKILL the PID-namespace inits (the kernel then kills everything in each
        #    host) and the unshare parents (ours, not yet reaped, so their pids are safe).
        for st in self._states:
            if st.pidfd is not None:
                try:
                    signal.pidfd_send_signal(st.pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.close(st.pidfd)
                st.pidfd = None
            elif st.init_pid and st.proc is not None and st.init_pid in _children(st.proc.pid):
                _kill_pids([st.init_pid], timeout=0)
            if st.proc is not None and st.proc.poll() is None:
                st.proc.kill()
        for st in self._states:
            if st.proc is not None:
                try:
                    st.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    errors.append(f"{st.name}: unshare pid {st.proc.pid} did not exit")
            if st.log is not None:
                st.log.close()
                st.log = None
        # 2. anything else still inside the namespaces (e.g. `ip netns exec` by a test), by pid
        if self._net_touched:
            existing = set(_netns_list())
            stray = [p for st in self._states if st.netns in existing for p in _netns_pids(st.netns)]
            if stray and _kill_pids(stray):
                errors.append(f"processes {stray} survived SIGKILL")
            # 3. one `ip` process for all deletions; deleting a netns destroys its veth pair
            lines = [f"netns del {st.netns}" for st in self._states if st.netns in existing]
            if _link_exists(self.bridge):
                lines.append(f"link del {self.bridge}")
            if lines:
                _ip_batch(lines, force=True)
            left = _wait_links_gone([st.veth for st in self._states], 5.0)
            if left:
                _ip_batch([f"link del {name}" for name in left], force=True)
            left_ns = [st.netns for st in self._states if st.netns in set(_netns_list())]
            left_links = [n for n in [st.veth for st in self._states] + [self.bridge] if _link_exists(n)]
            if left_ns or left_links:
                errors.append(f"left behind: netns {left_ns}, links {left_links}")
        if errors:
            raise LabError("; ".join(errors))
        self._lock.release()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)
        self._closed = True
        self.timings["destroy"] = time.monotonic() - t0


# --------------------------------------------------------------------------------------------
# pytest


def make_lab_fixture(
    n: int = 3, scope: Literal["session", "package", "module", "class", "function"] = "session", **lab_kwargs
):
    """A pytest fixture yielding a started TestHostLab of `n` hosts.

    Assign it in a conftest or test module; the fixture's name is the variable's name::

        netns_lab = make_lab_fixture(3)                   # scope="session" by default
        lab16 = make_lab_fixture(16, scope="module", start_timeout=60)
        nfs_lab = make_lab_fixture(3, scope="module", shared_home=True)   # one HOME for all hosts

    Skips (or fails, with TFCTL_REQUIRE_NETNS=1) when the lab cannot run here. The workdir
    (keys, configs, sshd logs) is a pytest tmp dir and is kept for inspection.
    """
    import pytest

    @pytest.fixture(scope=scope)
    def _lab_fixture(tmp_path_factory):
        require_netns()
        workdir = tmp_path_factory.mktemp("netns-lab")
        with TestHostLab(n, workdir=workdir, **lab_kwargs) as lab:
            yield lab

    return _lab_fixture
