"""The entrypoint of a task's container: runs the task, passes signals on to it, and ends it
when its monitor is gone.

`python3 tether.py FIFO LOG EXIT GRACE ARGV...`, run by the image's Python (any 3.x: it imports
nothing of tfctl's). The monitor holds FIFO open for writing as long as it lives; when it dies,
however (SIGKILL included), the read end here sees EOF and the task gets SIGTERM, then SIGKILL
after GRACE seconds: the container ends with its monitor, whatever the runtime, with no daemon
to trust. The task's output goes straight to LOG, the task's log (bind-mounted in), not through
the runtime's client, which may be stopped before the task has said its last; its exit status
goes to EXIT (bind-mounted in too), which a runtime's client may not pass on. As PID 1 of the
container it also reaps the task's orphans.
"""

import os
import select
import signal
import sys
import time
from types import FrameType
from typing import List, Optional

LOOK = 0.5  # seconds between looks for the task's end while nothing else happens


def main(argv: List[str]) -> int:
    status = run(argv[1], argv[2], float(argv[4]), argv[5:])
    with open(argv[3], "w") as f:
        f.write("%d\n" % status)
    return status


def run(fifo: str, log: str, grace: float, command: List[str]) -> int:
    """The task's exit status, once it ended by itself or was ended with its monitor."""
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    tie = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    child = os.fork()
    if child == 0:
        os.setsid()
        os.close(tie)
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)

    def pass_on(signum: int, _frame: Optional[FrameType]) -> None:
        _signal(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, pass_on)
    while True:
        status = _reap(child)
        if status is not None:
            return status
        select.select([tie], [], [], LOOK)
        if _monitor_gone(tie):
            sys.stderr.write("tfctl: the task's monitor is gone: ending the task\n")
            return _end(child, grace)


def _monitor_gone(tie: int) -> bool:
    """No writer holds the FIFO any more. Asked by a read, not by select alone: a FIFO whose
    only writer opened before this reader never reports the hang-up to poll (Linux's pipe_poll
    counts writers that came after the reader), but a read of it finds the end whatever."""
    try:
        return not os.read(tie, 512)
    except BlockingIOError:
        return False


def _signal(child: int, signum: int) -> None:
    """The task's whole group; with SIGKILL, every process of the container when this is its init."""
    try:
        os.killpg(child, signum)
    except OSError:
        pass
    if signum == signal.SIGKILL and os.getpid() == 1:
        try:
            os.kill(-1, signum)
        except OSError:
            pass


def _reap(child: int) -> Optional[int]:
    """The task's exit status (a signal N as 128 + N, as shells say it) once it has ended;
    orphans that ended are reaped on the way."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 1
        if pid == 0:
            return None
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _end(child: int, grace: float) -> int:
    _signal(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        status = _reap(child)
        if status is not None:
            return status
        time.sleep(0.05)
    _signal(child, signal.SIGKILL)
    while True:
        status = _reap(child)
        if status is not None:
            return status
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
