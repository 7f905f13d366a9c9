"""The run's controller process, apart from what it does: who it is (an attached `up` or the
detached watcher), whether it still lives, a new watcher when it died, ending the watcher.

Light to import on purpose: every `status`, `logs` and `down` asks these questions first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from tfctl.runs import RunRecord, RunStore
from tfctl.supervisor.files import host_key
from tfctl.supervisor.procfs import is_same_process, proc_stat
from tfctl.trace import traced


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
    return store.update(record.run_id, watcher=controller_of(proc.pid, attached=False))


def controller_of(pid: int, attached: bool) -> dict[str, Any]:
    """What identifies a run's controller process later: pid, kernel start time and machine
    (a run store on a shared home is read from other machines, where that pid means nothing)."""
    st = proc_stat(pid) or {}
    return {"pid": pid, "starttime": st.get("starttime"), "host": host_key(), "attached": attached}


def controller_of_this_process(attached: bool) -> dict[str, Any]:
    return controller_of(os.getpid(), attached)


def _controller_here(record: RunRecord) -> dict[str, Any] | None:
    """The controller of an active run, if it ran on this machine (a pid elsewhere means nothing)."""
    w = record.watcher
    if not record.active or not w or w.get("host", host_key()) != host_key():
        return None
    return w


def controller_lives(record: RunRecord) -> bool:
    """The active run's controller (attached `up` or detached watcher) runs on this machine."""
    w = _controller_here(record)
    return w is not None and is_same_process(w)


def controller_gone(record: RunRecord) -> bool:
    """An active run whose controller has died on this machine. False when it lives, when it
    ran elsewhere, or when the run is over."""
    w = _controller_here(record)
    return w is not None and not is_same_process(w)


def resume_supervision(store: RunStore, record: RunRecord) -> str | None:
    """A run whose controller died gets a new watcher, so it still ends when its job does;
    the sentence to tell the user, or None when nothing was amiss."""
    if not controller_gone(record):
        return None
    w = record.watcher or {}
    was = f"the `tfctl up` that started it (pid {w['pid']})" if w.get("attached") else f"its watcher (pid {w['pid']})"
    fresh = spawn_watcher(store, record)
    lease = (
        f"; its tasks stop on their hosts {record.lease_timeout:g}s after their controller (lease_timeout)"
        if w.get("attached") and record.lease_timeout
        else ""
    )
    pid = (fresh.watcher or {}).get("pid")
    return f"run {record.run_id}: {was} is gone; a new watcher (pid {pid}) supervises it{lease}"


@traced("lifecycle.stop_watcher")
def stop_watcher(record: RunRecord) -> None:
    """`down` takes over from the detached watcher: end it first so the two never race. An
    attached `up` is left alone: it sees its tasks stopped and ends by itself."""
    w = record.watcher  # see controller_of
    if not w or w.get("attached") or w.get("host", host_key()) != host_key() or not is_same_process(w):
        return
    os.kill(w["pid"], signal.SIGTERM)
    wait_gone(record)


def wait_gone(record: RunRecord, patience: float = 5.0) -> None:
    """Wait for the detached watcher to end; after `patience` seconds, kill it."""
    w = record.watcher
    if not w or w.get("attached") or w.get("host", host_key()) != host_key():
        return
    deadline = time.monotonic() + patience
    while is_same_process(w) and time.monotonic() < deadline:
        time.sleep(0.01)
    if is_same_process(w):
        os.kill(w["pid"], signal.SIGKILL)
