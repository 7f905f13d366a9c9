"""Forgetting ended runs on a host: their task records and logs, the run's own directory (the
synced workdir and the checkpoints under $TFCTL_RUN_DIR), and any container of the run left
behind (found by its label: one a crashed tfctl stopped but never removed).

Nothing of a run is touched while any process of it runs here (its marker is in the environment
of every process it started), whatever the controller's records say. Hosts that share a home
(NFS) share the run's directory: each removes its own task state, and the last of them to
forget the run, under a lock on the shared home, removes the run's directory too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from typing import Dict, Iterator, List

from . import containers, procfs
from .files import host_key, run_dir, work_dir
from .protocol import PruneAnswer, PruneRequest

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # as tfctl makes them: never a path


def prune(root: str, request: PruneRequest) -> PruneAnswer:
    running: Dict[str, List[int]] = {}
    wanted = set(request.runs)
    for pid in procfs.live_pids():
        run = procfs.proc_env_markers(pid)[0]
        if run in wanted and pid != os.getpid():
            running.setdefault(run, []).append(pid)
    paths: Dict[str, List[str]] = {}
    sizes: Dict[str, int] = {}
    kept: Dict[str, str] = {}
    boxes: Dict[str, List[str]] = {}
    left = [f for f in containers.labelled(containers.RUN_LABEL) if f[2] in wanted]  # one ask for every run
    for run in request.runs:
        if not RUN_ID.match(run) or ".." in run:
            kept[run] = "%r is not a run id" % run
            continue
        if run in running:
            pids = ", ".join(map(str, sorted(running[run])))
            kept[run] = "processes of the run still run here (pids %s)" % pids
            continue
        with _home_lock(root):
            holders = _holders(root, run)
            if request.every_host:
                mine = [*holders.values(), work_dir(root, run)]
            else:
                last = _last_holder(list(holders), request.dry_run)
                mine = [run_dir(root, run)] + ([work_dir(root, run)] if last else [])
            found = [d for d in mine if os.path.isdir(d)]
            paths[run] = found
            sizes[run] = sum(_size(d) for d in found)
            if not request.dry_run:
                for d in found:
                    shutil.rmtree(d)
        its = [f for f in left if f[2] == run]
        if its:
            boxes[run] = sorted(name for _, name, _ in its)
            if not request.dry_run:
                containers.remove(its)
    return PruneAnswer(paths, sizes, kept, boxes)


@contextlib.contextmanager
def _home_lock(root: str) -> Iterator[None]:
    """Held by one host at a time of those that share this home."""
    home = os.path.expanduser(root)
    os.makedirs(home, mode=0o700, exist_ok=True)
    with open(os.path.join(home, "prune.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        yield


def _holders(root: str, run: str) -> Dict[str, str]:
    """Key -> task state of the run, of every host that keeps some under this (shared) home."""
    base = os.path.join(os.path.expanduser(root), "hosts")
    try:
        keys = sorted(os.listdir(base))
    except OSError:
        keys = []
    states = {key: os.path.join(base, key, "tasks", run) for key in keys}
    return {key: state for key, state in states.items() if os.path.isdir(state)}


def _last_holder(holders: List[str], dry_run: bool) -> bool:
    """Whether this host removes the run's directory: no other host sharing this home still
    keeps task state of the run. In a dry run, where this host's state is still there, the one
    host of them whose key sorts last reports it."""
    me = host_key()
    others = [k for k in holders if k != me]
    return not others or (dry_run and me in holders and holders[-1] == me)


def _size(top: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
