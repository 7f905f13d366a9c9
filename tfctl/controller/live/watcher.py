"""The run's controller process, apart from what it does: who it is (an attached `up` or the
detached watcher), whether it still lives, forking the watcher that starts a detached run, a new
watcher when it died, ending the watcher.

Light to import on purpose: every `status`, `logs` and `down` asks these questions first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import IO, Any, Callable

from tfctl.runs import transitions
from tfctl.runs.record import Controller, ControllerKind, RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.files import host_key
from tfctl.supervisor.procfs import is_same_process, proc_stat
from tfctl.trace import traced

Report = Callable[[dict[str, Any]], None]


@traced("lifecycle.spawn_watcher")
def spawn_watcher(store: RunStore, record: RunRecord) -> RunRecord:
    """A detached `tfctl _watch` that ends the run when the job is done, so no ps lingers.

    It runs in its own session (a closed terminal does not stop it) and logs to the run dir.
    """
    log = open(store.run_dir(record.run_id) / "watch.log", "ab")
    with log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfctl", "_watch", "--run", record.run_id],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "TFCTL_HOME": str(store.home)},
        )
    controller = controller_of(proc.pid, ControllerKind.WATCHER)
    return transitions.apply(store, record.run_id, transitions.take_control(controller)) or record.replace(
        watcher=controller
    )


def fork_starter(body: Callable[[Report], None]) -> tuple[int, IO[str]]:
    """Fork this process into the watcher of a detached run that `body` starts then watches
    (`up -d`): the fork already holds tfctl's imports and the plan, so the tasks start as soon
    as with an attached `up`, and the watcher keeps the connections it started them with.

    The child runs in its own session (a closed terminal does not end it) and reports to the
    parent on a pipe, one JSON object a line; the parent gets the child's pid and that pipe.
    """
    _wait_for_other_threads()  # a fork copies no thread, but it does copy the locks they hold
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, os.fdopen(read_end, encoding="utf-8")
    os.close(read_end)
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # `up -d`'s terminal or pipes must not stay open in the run's processes
            os.dup2(null, fd)
        os.close(null)
        code = report_on(write_end, body)
    finally:
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # never back into the parent's click and atexit handlers


def report_on(fd: int, body: Callable[[Report], None]) -> int:
    """Run `body` of a starting watcher, its reports written to `fd` (the pipe `up` reads), a
    failure reported too; the exit code. A reader gone (its terminal closed) is no failure."""
    with os.fdopen(fd, "w", encoding="utf-8") as channel:

        def report(message: dict[str, Any]) -> None:
            with contextlib.suppress(OSError):  # `up -d` is gone (its terminal closed): go on
                channel.write(json.dumps(message) + "\n")
                channel.flush()

        try:
            body(report)
            return 0
        except BaseException as e:  # noqa: BLE001 - the watcher's top: it reports what ended it
            traceback.print_exc()  # to watch.log once the run is up
            report({"error": f"the run's watcher failed: {e!r}"})
            return 1


def _wait_for_other_threads(patience: float = 2.0) -> None:
    deadline = time.monotonic() + patience
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def log_to_run_dir(store: RunStore, run_id: str) -> None:
    """From here on this process's stdout and stderr go to the run's watch.log."""
    log = os.open(store.run_dir(run_id) / "watch.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def controller_of(pid: int, kind: ControllerKind) -> Controller:
    """What identifies a run's controller process later: pid, kernel start time and machine."""
    st = proc_stat(pid) or {}
    return Controller(kind, pid, st.get("starttime"), host_key())


def controller_of_this_process(kind: ControllerKind) -> Controller:
    return controller_of(os.getpid(), kind)


def is_running(controller: Controller) -> bool:
    """That very process still runs (not another that got its pid); only meaningful on its machine."""
    return is_same_process({"pid": controller.pid, "starttime": controller.starttime})


def _here(controller: Controller) -> bool:
    return controller.host in (None, host_key())


def _controller_here(record: RunRecord) -> Controller | None:
    """The controller of an active run, if it ran on this machine (a pid elsewhere means nothing)."""
    w = record.watcher
    if not record.active or w is None or not _here(w):
        return None
    return w


def controller_elsewhere(record: RunRecord) -> bool:
    """The active run's controller runs on another machine (a batch job's node)."""
    w = record.watcher
    return record.active and w is not None and not _here(w)


def controller_lives(record: RunRecord) -> bool:
    """The active run's controller (attached `up` or detached watcher) runs on this machine."""
    w = _controller_here(record)
    return w is not None and is_running(w)


def controller_gone(record: RunRecord) -> bool:
    """An active run whose controller has died on this machine. False when it lives, when it
    ran elsewhere, or when the run is over."""
    w = _controller_here(record)
    return w is not None and not is_running(w)


@traced("lifecycle.stop_watcher")
def stop_watcher(record: RunRecord) -> None:
    """`down` takes over from the detached watcher: end it first so the two never race. An
    attached `up` is left alone: it sees its tasks stopped and ends by itself."""
    w = record.watcher
    if w is None or w.attached or not _here(w) or not is_running(w):
        return
    os.kill(w.pid, signal.SIGTERM)
    wait_gone(record)


def wait_gone(record: RunRecord, patience: float = 5.0) -> None:
    """Wait for the detached watcher to end; after `patience` seconds, kill it."""
    w = record.watcher
    if w is None or w.attached or not _here(w):
        return
    end_process(w, patience)


def end_process(w: Controller, patience: float) -> None:
    """Wait for a controller process (a watcher, a sweep's driver) asked to end to be gone;
    after `patience` seconds, kill it."""
    deadline = time.monotonic() + patience
    while is_running(w) and time.monotonic() < deadline:
        time.sleep(0.01)
    if is_running(w):
        os.kill(w.pid, signal.SIGKILL)
