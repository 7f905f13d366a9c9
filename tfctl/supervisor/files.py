"""The supervisor's files on a host: atomic JSON records and where each run's tasks keep theirs.

Layout: <root>/tasks/<run_id>/<job>-<index>/{spec.json, proc.json, exit.json, stop.json,
output.log, monitor.log}; <root>/requests/ holds the journal of requests that must not run twice.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional


def write_json(path: str, data: Any) -> None:
    """Atomic write: readers see the old file or the new one, never half of it."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def run_dir(root: str, run_id: str) -> str:
    return os.path.join(os.path.expanduser(root), "tasks", run_id)


def task_dir(root: str, run_id: str, task: str) -> str:
    return os.path.join(run_dir(root, run_id), task.replace(":", "-"))
