"""The queue's own files under the run store: the driver's lock and who holds it, and the
driver's last look (each waiting run's place and why it waits) for `tfctl queue` to show.

The lock is a `flock` on a file in the run store, held by the driver for its whole life, so the
kernel ends it with the driver however it dies; which runs start is decided under the store's
lock (`transitions.take_from_queue`), so even two drivers (a run store shared by two machines)
never start one run twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from tfctl.runs.store import RunStore

DRIVER_LOG = "driver.log"


@dataclass(frozen=True)
class Look:
    """What the driver saw last: per run its place in its pool's queue and why it waits."""

    at: float = 0.0
    driver: int = 0  # its pid
    position: dict[str, int] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    others: dict[str, int] = field(default_factory=dict)  # another user -> runs they have waiting


def _lock_path(store: RunStore) -> Path:
    return store.queue_dir / "driver.lock"


@contextlib.contextmanager
def driver_lock(store: RunStore) -> Iterator[bool]:
    """Hold the driver's lock for the block: True, or False when another driver holds it."""
    store.queue_dir.mkdir(parents=True, exist_ok=True)
    with open(_lock_path(store), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield True


def driver_pid(store: RunStore) -> int | None:
    """The live driver's pid; None when no process holds the lock (so none starts runs)."""
    try:
        f = open(_lock_path(store))
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = f.read().strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def ensure_driver(store: RunStore) -> int | None:
    """Start the driver if runs wait and none runs: its pid when this started it, else None.
    Cheap enough for every tfctl command: one listing, and one lock tried when runs wait."""
    if not store.queued_ids() or driver_pid(store) is not None:
        return None
    return spawn_driver(store)


def spawn_driver(store: RunStore) -> int:
    """A `tfctl _queue` process in a session of its own (it outlives the terminal and the
    logout), logging to the queue's driver.log. It ends itself once nothing waits."""
    store.queue_dir.mkdir(parents=True, exist_ok=True)
    log: IO[bytes]
    with open(store.queue_dir / DRIVER_LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfctl", "_queue"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "TFCTL_HOME": str(store.home)},
        )
    return proc.pid


def write_look(store: RunStore, look: Look) -> None:
    """The driver's look, replaced whole (a reader never sees half of one)."""
    fd, temp = tempfile.mkstemp(dir=store.queue_dir, prefix=".look.")
    with os.fdopen(fd, "w") as f:
        json.dump(look.__dict__, f)
    os.replace(temp, store.queue_dir / "look.json")


def read_look(store: RunStore) -> Look:
    try:
        data: dict[str, Any] = json.loads((store.queue_dir / "look.json").read_text())
        return Look(**data)
    except (OSError, ValueError, TypeError):
        return Look()
