"""The simulated hosts' low-level tools: commands in the root namespace, links, namespaces and
their processes, the lab-wide lock and leftover clean-up, and whether this machine can have a lab
at all (`skip_reason`). `netns_hosts` builds the hosts and the lab from these."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from bench.waiting import WaitTimeout, wait_until

DEFAULT_PREFIX = "tfctl-t"
DEFAULT_BRIDGE = "tfctlbr0"
DEFAULT_SUBNET = "10.77.0"
REQUIRE_ENV = "TFCTL_REQUIRE_NETNS"
ROOT_NS_NAME = "tfctl-root"  # name of <subnet>.1 in the hosts' /etc/hosts
SSHD = "/usr/sbin/sshd"
LOCK_DIR = "/run/lock"
IFNAMSIZ = 15

# Runs as PID 1 of the host's PID namespace, inside its network namespace.


class LabError(RuntimeError):
    """The lab could not be created or removed."""


# --------------------------------------------------------------------------------------------
# small helpers


def _run(
    argv: Sequence[str], *, check: bool = True, input: str | None = None, timeout: float = 30
) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def _ip_batch(lines: Iterable[str], *, force: bool) -> subprocess.CompletedProcess:
    """Run many `ip` commands in one process (`-force`: keep going after errors)."""
    argv = ["ip"] + (["-force"] if force else []) + ["-batch", "-"]
    return _run(argv, check=not force, input="".join(line + "\n" for line in lines))


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def _netns_pids(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _alive(pid: int) -> bool:
    """True while /proc/<pid> exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # state is the field after the parenthesised comm (which may contain spaces/parens)
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def _kill_pids(pids: Iterable[int], timeout: float = 5.0) -> list[int]:
    """SIGKILL each pid and wait until it is gone; returns the pids still alive."""
    pids = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        wait_until(
            lambda: [p for p in pids if _alive(p)], timeout, "killed", until=lambda alive: not alive, interval=0.02
        )
    except WaitTimeout as late:
        assert isinstance(late.last, list)
        return late.last
    return []


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(tok) for tok in f.read().split()]
    except FileNotFoundError:
        return []


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _tcp_connect(address: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return text[-limit:] if text.strip() else "<empty>"


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # preexec_fn: runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# --------------------------------------------------------------------------------------------
# leftovers and the per-prefix lock


def _cleanup(prefix: str, bridge: str) -> dict[str, list]:
    """Remove namespaces/links named `<prefix>-*` and `bridge`, killing their processes by pid."""
    removed: dict[str, list] = {"pids": [], "netns": [], "links": []}
    stale = [ns for ns in _netns_list() if ns.startswith(prefix + "-")]
    pids = [pid for ns in stale for pid in _netns_pids(ns)]
    if pids:
        still = _kill_pids(pids)
        if still:
            raise LabError(f"leftover processes {still} in {stale} survived SIGKILL")
        removed["pids"] = sorted(set(pids))
    if stale:
        _ip_batch([f"netns del {ns}" for ns in stale], force=True)
        removed["netns"] = stale
    # Root-side veth ends vanish asynchronously once their namespace is gone.
    links = [name for name in _links() if name.startswith(prefix + "-")]
    if links:
        _wait_links_gone(links, 2.0)
    links_now = [name for name in _links() if name.startswith(prefix + "-")]
    if _link_exists(bridge):
        links_now.append(bridge)
    if links_now:
        _ip_batch([f"link del {name}" for name in links_now], force=True)
    removed["links"] = sorted(set(links) | set(links_now))
    left = [ns for ns in _netns_list() if ns.startswith(prefix + "-")]
    left_links = [name for name in _links() if name.startswith(prefix + "-") or name == bridge]
    if left or left_links:
        raise LabError(f"could not remove leftovers: netns {left}, links {left_links}")
    return removed


def _wait_links_gone(names: Iterable[str], timeout: float) -> list[str]:
    """Waits until none of the links exists; returns those still there after `timeout`."""
    names = list(names)
    try:
        wait_until(
            lambda: [n for n in names if _link_exists(n)], timeout, "gone", until=lambda left: not left, interval=0.02
        )
    except WaitTimeout as late:
        assert isinstance(late.last, list)
        return late.last
    return []


class _Lock:
    """An flock per prefix: held while a lab exists, released by the kernel if we crash."""

    def __init__(self, prefix: str) -> None:
        lock_dir = LOCK_DIR if os.path.isdir(LOCK_DIR) else tempfile.gettempdir()
        self.path = os.path.join(lock_dir, f"{prefix}-netns-lab.lock")
        self._fd: int | None = None

    def acquire(self, timeout: float) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

        def locked() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                return False
            return True

        try:
            wait_until(locked, timeout, f"the lock on {self.path}", interval=0.1)
        except (WaitTimeout, OSError) as exc:
            os.close(fd)
            raise LabError(
                f"another test host lab using this prefix is running ({self.path} is "
                f"locked); use a different prefix/bridge/subnet"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


def cleanup_leftovers(
    prefix: str = DEFAULT_PREFIX, bridge: str = DEFAULT_BRIDGE, lock_timeout: float = 0.0
) -> dict[str, list]:
    """Remove what a crashed earlier lab with this prefix/bridge left behind.

    Kills (SIGKILL, by pid, as listed by `ip netns pids`) every process in a namespace named
    `<prefix>-*`, deletes those namespaces, links named `<prefix>-*` and the bridge. Refuses
    (LabError) while a live lab holds the prefix's lock. Returns what was removed.
    """
    lock = _Lock(prefix)
    lock.acquire(lock_timeout)
    try:
        return _cleanup(prefix, bridge)
    finally:
        lock.release()


# --------------------------------------------------------------------------------------------
# skip / require


@lru_cache(maxsize=None)
def skip_reason() -> str | None:
    """Why the lab cannot run on this machine, or None if it can (result is cached)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, bridge)"
    for tool in ("ip", "unshare", "nsenter", "ssh-keygen", "ssh", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (install openssh-server)"
    # Probe with names outside the `<prefix>-` space so a concurrent cleanup cannot touch them.
    tag = str(os.getpid())
    ns, br, veth = f"tfpr{tag}", f"tfpb{tag}", f"tfpv{tag}"
    try:
        _ip_batch(
            [
                f"netns add {ns}",
                f"link add {br} type bridge",
                f"link add {veth} type veth peer name eth0 netns {ns}",
                f"link set {veth} master {br} up",
            ],
            force=False,
        )
        res = _run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "unshare",
                "--uts",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                "--",
                "hostname",
                "tfprobe",
            ],
            check=False,
            timeout=15,
        )
        if res.returncode != 0:
            return f"unshare --uts --pid --mount-proc fails: {res.stderr.strip()}"
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace/veth/bridge: {exc}"
    finally:
        _ip_batch([f"netns del {ns}", f"link del {br}"], force=True)
        if _link_exists(veth):
            _wait_links_gone([veth], 2.0)
            _ip_batch([f"link del {veth}"], force=True)
    return None


def require_netns() -> None:
    """In a test: skip if the lab cannot run here; fail instead if TFCTL_REQUIRE_NETNS=1."""
    import pytest

    reason = skip_reason()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_ENV} is set but the netns host lab cannot run: {reason}", pytrace=False)
    pytest.skip(f"netns host lab unavailable: {reason}")


# --------------------------------------------------------------------------------------------
# hosts
