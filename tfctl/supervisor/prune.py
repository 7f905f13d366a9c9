"""Forgetting ended runs on a host: their task records and logs, and the run's own directory
(the synced workdir and the checkpoints under $TFCTL_RUN_DIR).

Nothing of a run is touched while any process of it runs here (its marker is in the environment
of every process it started), whatever the controller's records say.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Dict, List

from . import procfs
from .files import run_dir, work_dir
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
    for run in request.runs:
        if not RUN_ID.match(run) or ".." in run:
            kept[run] = "%r is not a run id" % run
            continue
        if run in running:
            pids = ", ".join(map(str, sorted(running[run])))
            kept[run] = "processes of the run still run here (pids %s)" % pids
            continue
        found = [d for d in (run_dir(root, run), work_dir(root, run)) if os.path.isdir(d)]
        paths[run] = found
        sizes[run] = sum(_size(d) for d in found)
        if not request.dry_run:
            for d in found:
                shutil.rmtree(d)
    return PruneAnswer(paths, sizes, kept)


def _size(top: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
