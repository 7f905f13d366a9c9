"""One task's state, from the files its monitor wrote, checked against /proc."""

from __future__ import annotations

import os
import time
from typing import Optional, Tuple

from . import disk, procfs
from .files import read_json, task_dir
from .protocol import Attempt, TaskInfo, TaskState


def task_state(root: str, run_id: str, task: str) -> TaskInfo:
    """The truth about one task, read from its files and from /proc."""
    d = task_dir(root, run_id, task)
    if not os.path.isdir(d):
        return TaskInfo(task)
    proc = read_json(os.path.join(d, "proc.json"))
    ended = read_json(os.path.join(d, "exit.json"))
    stop = read_json(os.path.join(d, "stop.json"))
    restarts = read_json(os.path.join(d, "restarts.json")) or {}
    held = _held_end(proc, ended)
    if held is not None:
        ended, stop = held
    if ended:
        state = _end_state(ended, stop)
    elif proc is None:
        state = TaskState.STARTING
    elif procfs.is_same_process(proc):
        state = TaskState.RUNNING
    elif proc.get("monitor") and procfs.is_same_process(proc["monitor"]):
        # Between two attempts, or ended this moment (its monitor is writing exit.json).
        state = TaskState.RESTARTING if restarts.get("pending") else TaskState.RUNNING
    else:
        # The monitor writes exit.json as the task ends, then leaves: it may have done both since
        # the read above (CI saw a task that exited 0 at once called lost). Gone without it: lost.
        ended = read_json(os.path.join(d, "exit.json"))
        stop = read_json(os.path.join(d, "stop.json"))
        state = _end_state(ended, stop) if ended else TaskState.LOST
    ended = ended or {}
    proc = proc or {}
    return TaskInfo(
        task,
        state,
        pid=proc.get("pid"),
        pgid=proc.get("pgid"),
        exit_code=ended.get("exit_code"),
        signal=ended.get("signal"),
        started_at=proc.get("started_at"),
        ended_at=None if held else ended.get("ended_at"),
        error=ended.get("error"),
        stop_reason=(stop or {}).get("reason") if state is TaskState.STOPPED else None,
        restarts=len(restarts.get("ends", [])),
        earlier_ends=list(restarts.get("ends", [])),
        # Older monitors kept no times: their restarts are counted, not placed in time.
        attempts=[Attempt(a, b, end) for (a, b), end in zip(restarts.get("spans", []), restarts.get("ends", []))],
        unrecorded=held is not None,
    )


def _end_state(ended: dict, stop: Optional[dict]) -> TaskState:
    """A task with an exit record: stopped if asked to before it ended, else by its code."""
    if stop is not None and stop["requested_at"] <= ended["ended_at"]:
        return TaskState.STOPPED
    return TaskState.SUCCEEDED if ended.get("exit_code") == 0 else TaskState.FAILED


def _held_end(proc: Optional[dict], ended: Optional[dict]) -> Optional[Tuple[dict, Optional[dict]]]:
    """The end (exit record, stop record) that the task's live monitor holds because the disk
    refused to take it (`disk.hold_end`), or None."""
    monitor = (proc or {}).get("monitor")
    if ended is not None or not monitor or not procfs.is_same_process(monitor):
        return None
    held = disk.held_end(monitor["pid"])
    if held is None:
        return None
    code, stopped = held
    now = time.time()
    record = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None, "ended_at": now}
    return record, ({"requested_at": now} if stopped else None)
