"""The supervisor's files on a host: atomic JSON records and where each run's tasks keep theirs.

Hosts often share one home directory (NFS on lab and HPC clusters), so everything a host keeps
for itself lives under a directory named after the host, and every temporary name carries the
host too. Layout under <root>/hosts/<hostname>-<machine id>/: tasks/<run_id>/<job>-<index>/
{spec.json, proc.json, exit.json, stop.json, output.log, monitor.log}, and requests/, the journal
of requests that must not run twice. A run's own files, shared by hosts that share <root>, are
under <root>/work/<run_id>/.
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any, Optional

_HOST_KEY: list = []


def host_key() -> str:
    """This host, as a directory name: its hostname and machine id, which no two hosts share even
    when they share a home (the boot id stands in where there is no machine id)."""
    if not _HOST_KEY:
        machine = ""
        for path in ("/etc/machine-id", "/var/lib/dbus/machine-id", "/proc/sys/kernel/random/boot_id"):
            try:
                with open(path) as f:
                    machine = f.read().strip().replace("-", "")
            except OSError:
                continue
            if machine:
                break
        name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
        _HOST_KEY.append("%s-%s" % (name, machine[:12] or "0"))
    return _HOST_KEY[0]


def unique_temp(path: str) -> str:
    """A temporary name beside `path` that no other process, on this host or another, uses."""
    return "%s.tmp.%s.%d" % (path, host_key(), os.getpid())


def write_json(path: str, data: Any) -> None:
    """Atomic write: readers see the old file or the new one, never half of it."""
    tmp = unique_temp(path)
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


MAX_RECORD = 4 * 1024 * 1024  # bytes: a record is a few hundred; one bigger was not written by tfctl


def read_json(path: str) -> Optional[Any]:
    """A JSON record; None if there is none, or it is not one tfctl wrote (unreadable, or
    larger than MAX_RECORD: files on a host are read without trusting them)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD + 1)
        return json.loads(data) if len(data) <= MAX_RECORD else None
    except (FileNotFoundError, ValueError):
        return None


def state_root(root: str) -> str:
    """Where this host keeps its own state under the controller's `root`."""
    return os.path.join(os.path.expanduser(root), "hosts", host_key())


def run_dir(root: str, run_id: str) -> str:
    return os.path.join(state_root(root), "tasks", run_id)


def task_dir(root: str, run_id: str, task: str) -> str:
    return os.path.join(run_dir(root, run_id), task.replace(":", "-"))


RUN_DIR_ENV = "TFCTL_RUN_DIR"


def work_dir(root: str, run_id: str) -> str:
    """The run's own directory on this host, given to its tasks as $TFCTL_RUN_DIR (checkpoints):
    the synced workdir's copy on a remote host, an empty one where tasks run in place. Removed
    with the rest of the run's files by `tfctl runs --prune` only, never when the run ends."""
    return os.path.join(os.path.expanduser(root), "work", run_id)
