"""Requests that must not run twice (`start`, `listen`) run once per request id.

A connection can drop after a request was sent and before its answer came back; the controller
then sends it again, on a new conversation, perhaps while the first is still running. Each id
has a lock file, held while the request runs, and a record of its answer, written before the
answer is sent: a replay waits for the lock, then answers from the record.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from typing import Any, Callable, Dict

from . import disk
from .errors import AgentError
from .files import read_json, state_root, write_json

KEEP_SECONDS = 24 * 3600  # no replay comes this late: older records are deleted
REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def journal_dir(root: str) -> str:
    return os.path.join(state_root(root), "requests")


def once(root: str, request_id: str, run: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """The wire answer of request `request_id`: `run()`'s, or the recorded one of an earlier run."""
    if not REQUEST_ID.match(request_id):
        raise AgentError("request id %r is not a plain word" % request_id)
    d = journal_dir(root)
    os.makedirs(d, mode=0o700, exist_ok=True)
    prune(d)
    record = os.path.join(d, request_id + ".json")
    with open(os.path.join(d, request_id + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        answer = read_json(record)
        if answer is None:
            answer = run()
            try:
                write_json(record, answer)
            except OSError as e:
                if not disk.refused(e):
                    raise
                # What ran is done: its answer is the truth. A replay then runs it again, which
                # `start` refuses for tasks already started here.
        return answer


def prune(d: str) -> None:
    """Delete records and locks older than KEEP_SECONDS."""
    horizon = time.time() - KEEP_SECONDS
    for name in os.listdir(d):
        path = os.path.join(d, name)
        try:
            if os.stat(path).st_mtime < horizon:
                os.remove(path)
        except OSError:
            continue
