"""A detached run's watcher as a new process (`tfctl _start`): the API's `up`, and a queue's
driver, start one instead of forking (a threaded process cannot be forked safely). It gets the
drafted record on its stdin and reports how the start went on a pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable

from tfctl.runs.store import RunStore

if TYPE_CHECKING:
    from tfctl.controller.start.plan import Draft

Progress = Callable[[str, str], None]  # (who, what), as `up` prints them


@dataclass(frozen=True)
class Started:
    """A watcher process starting a detached run: its pid, its reports (one JSON object a line:
    `progress`, then `running`, `error` or `interrupted`) and how to reap it once it is gone."""

    pid: int
    reports: IO[str]
    reap: Callable[[], None]


Starter = Callable[["Draft"], Started]


def relay(reports: IO[str], progress: Progress) -> dict[str, Any]:
    """The starting watcher's progress, told; its last word (`running`, `error`, `interrupted`)."""
    for line in reports:
        message = json.loads(line)
        if "progress" in message:
            progress(*message["progress"])
            continue
        return dict(message)
    return {
        "error": "the run's watcher ended before the run started",
        "hint": "its log is watch.log in the run's directory under $TFCTL_HOME/runs, if the run got that far",
        "gone": True,
    }


def spawner(store: RunStore, accept_new_host_keys: bool) -> Starter:
    """A new `tfctl _start` process as the run's watcher: in its own session, logging to the
    run's watch.log, given the drafted run on its stdin and a pipe for its reports. A thread
    here reaps it when it ends, so it never lingers as a zombie of the caller."""

    def start(run: Draft) -> Started:
        from tfctl.runs import transitions

        transitions.keep_cluster_file(store, run.record.run_id, run.config.source)
        read_end, write_end = os.pipe()
        command = [sys.executable, "-m", "tfctl", "_start", "--report-fd", str(write_end)]
        with open(store.run_dir(run.record.run_id) / "watch.log", "ab") as log:
            proc = subprocess.Popen(
                [*command, *(["--accept-new-host-keys"] if accept_new_host_keys else [])],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                pass_fds=(write_end,),
                start_new_session=True,
                env={**os.environ, "TFCTL_HOME": str(store.home)},
            )
        os.close(write_end)
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError), proc.stdin:  # (gone at once: its reports say so)
            proc.stdin.write(pickle.dumps(run.record))
        reaper = threading.Thread(target=proc.wait, name=f"reap {proc.pid}", daemon=True)
        reaper.start()
        return Started(proc.pid, os.fdopen(read_end, encoding="utf-8"), reaper.join)

    return start
