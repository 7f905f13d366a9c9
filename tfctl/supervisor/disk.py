"""A disk that refuses writes (full, over quota, failing) must not cost a run its supervision.

The monitor's records (exit.json, stop.json, proc.json) are kept in memory and written again
until the disk takes them (`keep`); until then a monitor that holds its task's end says so in
its process name (`hold_end`, read by `held_end`), which needs no disk. `trouble` probes the
disk for `status`, so the controller can name the host and why. The task's own output is its
stdout, the output.log file itself: while the disk is full the task's writes fail in the task,
which is the task's business (most programs raise or drop the line); what it wrote meanwhile is
lost, and its monitor says so in the log once space returns (`Outage`).
"""

from __future__ import annotations

import errno
import os
import re
import sys
import time
from typing import Any, Callable, Optional, Tuple

from .files import unique_temp, write_json

DISK_ERRNOS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EIO: "I/O error"}
RETRY = 1.0  # seconds between attempts to write a record the disk refused
PROBE_BYTES = 4096  # one page: what the smallest record needs on any filesystem
LOW_SPACE = 64 * 1024  # bytes free below which the task's own writes are taken to fail
_HELD = re.compile(r"^tfctl=([xk])(\d+)(s?)$")


def refused(e: OSError) -> bool:
    """The disk refused a write (as opposed to a missing directory or a permission)."""
    return e.errno in DISK_ERRNOS


def why(e: OSError, where: str) -> str:
    """`disk full under ~/.tfctl (No space left on device)`."""
    return "%s under %s (%s)" % (DISK_ERRNOS.get(e.errno or 0, "write error"), where, os.strerror(e.errno or 0))


def trouble(directory: str, where: str) -> Optional[str]:
    """Why writes under `directory` fail right now, or None: a page written and removed."""
    path = unique_temp(os.path.join(directory, ".probe"))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        return why(e, where) if refused(e) else None
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        return None
    except OSError as e:
        return why(e, where) if refused(e) else None
    finally:
        os.close(fd)
        os.unlink(path)


def keep(path: str, data: Any, waiting: Callable[[], None] = lambda: None) -> None:
    """write_json, again every RETRY seconds while the disk refuses it; `waiting` runs before
    each retry (the record is held in memory meanwhile)."""
    told = False
    while True:
        try:
            write_json(path, data)
            return
        except OSError as e:
            if not refused(e):
                raise
            if not told:
                say("tfctl monitor: cannot write %s: %s; retrying every %gs" % (path, e, RETRY))
                told = True
        waiting()
        time.sleep(RETRY)


def say(text: str) -> None:
    """A line in monitor.log, if the disk takes it."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except OSError:
        pass


def hold_end(code: int, stopped: bool) -> None:
    """Name this process after the end it holds (`tfctl=x3`: exit code 3; `tfctl=k9s`: killed
    by signal 9, stopped on request), so `held_end` reads it with no disk."""
    name = "tfctl=%s%d%s" % ("k" if code < 0 else "x", abs(code), "s" if stopped else "")
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name)
    except OSError:
        pass


def held_end(pid: int) -> Optional[Tuple[int, bool]]:
    """(exit code, negative for a signal; stopped on request) that monitor `pid` holds unwritten."""
    try:
        with open("/proc/%d/comm" % pid) as comm:
            match = _HELD.match(comm.read().strip())
    except OSError:
        return None
    if match is None:
        return None
    number = int(match.group(2))
    return (-number if match.group(1) == "k" else number), bool(match.group(3))


class Outage:
    """The monitor's view of the disk while its task runs: when space ran out and came back."""

    def __init__(self, directory: str, log_path: str) -> None:
        self.directory = directory
        self.log_path = log_path
        self.since: Optional[float] = None

    def low(self) -> bool:
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < LOW_SPACE

    def check(self) -> None:
        """Once a poll: note when the disk fills; once it has room again, say so in the log."""
        if self.low():
            if self.since is None:
                self.since = time.time()
            return
        if self.since is not None and self._tell(time.time()):
            self.since = None

    def _tell(self, now: float) -> bool:
        assert self.since is not None
        line = "tfctl: the disk under %s was full from %s to %s: output written meanwhile is lost\n" % (
            os.path.dirname(self.log_path),
            time.strftime("%H:%M:%S", time.localtime(self.since)),
            time.strftime("%H:%M:%S", time.localtime(now)),
        )
        try:
            with open(self.log_path, "ab") as log:
                log.write(line.encode())
            return True
        except OSError:
            return False
