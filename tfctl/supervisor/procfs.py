"""What /proc says about processes and sockets, and how to end a set of processes for sure.

A pid alone never identifies a process here: the kernel start time (and the boot id) recorded
with it tell a task from a later process that reuses its pid.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from . import sockdiag
from .records import Record, record

RUN_ENV = "TFCTL_RUN_ID"
TASK_ENV = "TFCTL_TASK"
STORE_ENV = "TFCTL_STORE"  # which controller's run store started the process: reaping touches only its own
POLL = 0.05


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> Optional[dict]:
    """pid's ppid, pgid, sid, state and start time (clock ticks since boot), or None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(")", 1)[1].split()
    return {
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "starttime": int(fields[19]),
    }


def proc_markers(pid: int) -> Dict[str, str]:
    """tfctl's markers (TFCTL_RUN_ID, TFCTL_TASK, TFCTL_STORE) in pid's environment, read once."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read()
    except OSError:
        return {}
    found = {}
    for item in env.split(b"\0"):
        if item.startswith(b"TFCTL_"):
            name, _, value = item.partition(b"=")
            if name.decode(errors="replace") in (RUN_ENV, TASK_ENV, STORE_ENV):
                found[name.decode()] = value.decode(errors="replace")
    return found


def proc_env_markers(pid: int) -> Tuple[Optional[str], Optional[str]]:
    """(TFCTL_RUN_ID, TFCTL_TASK) from pid's environment; (None, None) if unreadable or absent."""
    markers = proc_markers(pid)
    return markers.get(RUN_ENV), markers.get(TASK_ENV)


def proc_cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def live_pids() -> List[int]:
    """Every process that still runs (zombies are dead: they only wait to be reaped)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st["state"] not in ("Z", "X"):
                pids.append(int(name))
    return pids


def is_same_process(proc: dict) -> bool:
    """True if the pid recorded in `proc` ({"pid", "starttime", "boot_id"?}) is still that very
    process, not a reuse of its pid."""
    st = proc_stat(proc["pid"])
    return (
        st is not None
        and st["state"] not in ("Z", "X")
        and st["starttime"] == proc["starttime"]
        and boot_id() == proc.get("boot_id", boot_id())
    )


def _pid_depth(pid: str) -> Tuple[int, bool]:
    """(how many PID namespaces deep the process is, whether it is the first process of its own)."""
    try:
        with open("/proc/%s/status" % pid) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids), ids[-1] == "1"
    except OSError:
        pass
    return 0, False


def to_signal(pids: List[int]) -> List[int]:
    """`pids` less those inside a container (a PID namespace below ours) that are not its first
    process: that one (the tether) passes a signal on to them, once, and its end is theirs, so
    signalled directly too they would get each signal twice (a checkpoint saved twice over)."""
    mine = _pid_depth("self")[0]
    kept = []
    for pid in pids:
        depth, first = _pid_depth(str(pid))
        if depth <= mine or first:
            kept.append(pid)
    return kept


def task_processes(run_id: str, task: str, proc: Optional[dict]) -> List[int]:
    """Every live process of one task: its process group, plus anything carrying its markers.

    A group member counts only while the group is provably the task's: its leader is the
    recorded process, or the leader is gone (the kernel does not reuse a pid that still names
    a process group, so a non-empty group whose leader died is still the original one).
    """
    own_group = None
    if proc is not None:
        leader = proc_stat(proc["pid"])
        if leader is None or leader["state"] in ("Z", "X") or is_same_process(proc):
            own_group = proc["pgid"]
    found = []
    me = os.getpid()
    for pid in live_pids():
        if pid == me:
            continue
        st = proc_stat(pid)
        if st is None:
            continue
        if own_group is not None and st["pgid"] == own_group:
            found.append(pid)
            continue
        run, marker = proc_env_markers(pid)
        if run == run_id and marker == task:
            found.append(pid)
    return found


def descendants(pid: int) -> List[int]:
    """pid and every process below it, from the kernel's children lists: a few small reads,
    where `task_processes` reads every process on the host."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        try:
            threads = os.listdir("/proc/%d/task" % current)
        except OSError:
            continue
        for tid in threads:
            try:
                with open("/proc/%d/task/%s/children" % (current, tid)) as f:
                    queue.extend(int(child) for child in f.read().split())
            except (OSError, ValueError):
                continue
    return found


def signal_all(pids: List[int], sig: int) -> None:
    """Signal the whole group of each process that leads a group, and each other process not in
    one of those groups: every process once (a handler that saves on SIGTERM runs once)."""
    groups = set()
    group_of = {}
    for pid in pids:
        st = proc_stat(pid)
        if st is not None:
            group_of[pid] = st["pgid"]
            if st["pgid"] == pid:
                groups.add(pid)
    for pgid in sorted(groups):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        if group_of.get(pid) in groups:
            continue  # signalled with its group
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


@record
class Termination(Record):
    """How many processes were seen, how many needed SIGKILL, and which survived even that."""

    processes: int
    killed: int
    remaining: List[int]
    seen: List[int]

    def still_exiting(self) -> bool:
        """A stopped process still has its /proc entry: a zombie, or one whose main thread has
        exited while its other threads free its memory, holding its files open until they do."""
        return any(os.path.exists("/proc/%d" % pid) for pid in self.seen)


def terminate(find: Callable[[], List[int]], grace: float, signalled: bool = False) -> Termination:
    """SIGTERM, wait up to `grace`, SIGKILL, wait, and report what still runs.

    `find` re-lists the target processes each round, so children forked during the grace
    period are caught as well. `signalled`: they have had their SIGTERM (from a stop under
    way): no second one, only the grace and SIGKILL.
    """
    seen: Set[int] = set()
    pids = find()
    seen.update(pids)
    killed: Set[int] = set()
    if pids:
        if not signalled:
            signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(POLL)
            pids = find()
            seen.update(pids)
        rounds = 0
        while pids and rounds < 100:
            killed.update(pids)
            signal_all(pids, signal.SIGKILL)
            time.sleep(POLL)
            pids = find()
            seen.update(pids)
            rounds += 1
    return Termination(len(seen), len(killed), pids, sorted(seen))


TCP_ESTABLISHED = "01"
TCP_LISTEN = "0A"


def tcp_sockets(state: str) -> Dict[int, Set[int]]:
    """local port -> socket inodes of TCP sockets in `state` (kernel hex code), IPv4 and IPv6."""
    found = sockdiag.tcp_sockets(int(state, 16))
    if found is not None:
        return found
    ports: Dict[int, Set[int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == state:
                        port = int(parts[1].rsplit(":", 1)[1], 16)
                        ports.setdefault(port, set()).add(int(parts[9]))
        except OSError:
            continue
    return ports


def listening_sockets() -> Dict[int, Set[int]]:
    """port -> socket inodes of TCP sockets in LISTEN state."""
    return tcp_sockets(TCP_LISTEN)


def socket_owners(inodes: Set[int], pids: Optional[List[int]] = None) -> List[int]:
    """Processes (among `pids`, or all) holding one of the socket inodes."""
    wanted = {"socket:[%d]" % i for i in inodes}
    owners = []
    for pid in pids if pids is not None else live_pids():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in wanted:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return owners
