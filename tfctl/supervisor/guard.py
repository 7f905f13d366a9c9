"""Why a task must stop although nobody asked: decided on its host, with no controller needed.

Two rules, checked by each task's monitor while the task runs:

- The lease. An attached `tfctl up` renews a lease on every host of its run; if the renewals stop
  (the laptop slept, the terminal closed, the controller was killed) for `lease.timeout` seconds,
  the run's tasks on this host stop. Detached runs have no lease: they train on without tfctl.
- The idle rule. A task that never ends by itself (a ps; the workers of a ParameterServerStrategy
  job) stops once the job it serves is over: nothing is connected to its port, and every
  decisive task (the ones the success policy watches) that was once seen listening now refuses
  connections, for `idle.timeout` seconds on end. Probes are sent only while nothing is connected,
  so a training job is never probed. A job whose peers were once connected to the task has
  started, so its decisive tasks count as seen; one that never listened and was never connected
  to, within the start-up timeout plus the idle timeout, counts as gone too.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Dict, List, Optional, Set

from . import procfs
from .files import read_json, run_dir, unique_temp
from .protocol import IdleRule

LEASE_FILE = "lease.json"
LEASE_BYTES = 160
IDLE_POLL = 5.0  # at most this long between idle checks: the rule acts after minutes, not seconds
PROBE_TIMEOUT = 2.0


def start_lease(root: str, run_id: str, timeout: float) -> None:
    """Give the run a lease on this host, renewed from now on by `renew_lease`."""
    _write_lease(os.path.join(run_dir(root, run_id), LEASE_FILE), timeout)


def renew_lease(root: str, run_id: str) -> None:
    """The controller is alive now: extend the run's lease, if it has one."""
    path = os.path.join(run_dir(root, run_id), LEASE_FILE)
    lease = read_json(path)
    if lease and lease.get("timeout"):
        _write_lease(path, lease["timeout"])


def _write_lease(path: str, timeout: float) -> None:
    """Renewed by this host's monotonic clock, which no controller's clock and no change of the
    wall clock can skew. Not fsynced: a lease does not outlive a crash of its host, nor do the
    tasks it guards."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    text = '{"timeout": %r, "renewed": %r, "renewed_at": %r}' % (timeout, time.monotonic(), time.time())
    text = text.ljust(LEASE_BYTES)  # every renewal fits in the blocks of the one before
    tmp = unique_temp(path)
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not _renew_in_place(path, text):
            raise


def _renew_in_place(path: str, text: str) -> bool:
    """Overwrite the lease in the blocks it has, padded to its size: a full disk must not let
    the lease of a live controller run out. A reader may see half of it, which reads as no lease
    (`read_json`: None), never as an expired one."""
    try:
        with open(path, "r+") as f:
            size = os.fstat(f.fileno()).st_size
            if len(text) > size:
                return False
            f.write(text.ljust(size))
        return True
    except OSError:
        return False


def lease_expired(task_dir: str) -> Optional[str]:
    """Why the run's lease ran out, or None while it holds (or the run has none)."""
    lease = read_json(os.path.join(os.path.dirname(task_dir), LEASE_FILE))
    if not lease or not lease.get("timeout"):
        return None
    silent = time.monotonic() - lease["renewed"]
    if silent < lease["timeout"]:
        return None
    return "no controller for %.0f s (its lease ran out)" % silent


def probe(address: str) -> Optional[bool]:
    """True: something accepts connections there; False: refused (nothing listens); None: no
    answer (the host is unreachable or slow), which proves nothing."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT):
            return True
    except ConnectionRefusedError:
        return False
    except OSError as e:
        return False if e.errno == errno.ECONNREFUSED else None


def connected(port: int) -> bool:
    """Whether any peer holds an established connection to this port on this host."""
    return port in procfs.tcp_sockets(procfs.TCP_ESTABLISHED)


class IdleWatch:
    """The idle rule for one task; `check()` every few seconds says when the job is over."""

    def __init__(self, rule: IdleRule, started: float) -> None:
        self.rule = rule
        self.started = started
        self.seen_listening: Set[str] = set()
        self.last_connected: Optional[float] = None  # when a peer was last seen connected to the port
        self.idle_since: Optional[float] = None
        self.next_check = 0.0
        self.poll = min(IDLE_POLL, rule.timeout / 4)

    def check(self, now: float) -> Optional[str]:
        """Why the task must stop now, or None."""
        if now < self.next_check:
            return None
        self.next_check = now + self.poll
        gone = self._gone(now)
        if gone is None:
            self.idle_since = None
            return None
        if self.idle_since is None:
            self.idle_since = now
        if now - self.idle_since < self.rule.timeout:
            return None
        quiet_since = self.started if self.last_connected is None else self.last_connected
        return "the job it serves is over (%s gone, nothing connected to port %d for %.0f s)" % (
            ", ".join(gone),
            self.rule.port,
            now - quiet_since,
        )

    def _gone(self, now: float) -> Optional[List[str]]:
        """The decisive tasks, when all are gone and nothing is connected; else None."""
        if not self.rule.watch:
            return None
        if connected(self.rule.port):
            self.last_connected = now  # its peers are up: the job has started
            return None
        answers: Dict[str, Optional[bool]] = {name: probe(addr) for name, addr in self.rule.watch.items()}
        self.seen_listening.update(name for name, up in answers.items() if up)
        if any(up is not False for up in answers.values()):
            return None  # one listens, or cannot be told apart from listening
        never_seen = [name for name in answers if name not in self.seen_listening]
        if never_seen and self.last_connected is None and now - self.started < self.rule.startup_timeout:
            return None  # may still be starting
        return sorted(answers)
