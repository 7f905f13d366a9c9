"""`notify:` commands: what the run's controller (attached `up`, or the watcher) runs on this
machine when something happens to the run, so a run nobody watches still reaches its user.

Each command is the user's shell text, run as written by `/bin/sh` (as `setup:` commands are):
tfctl fills nothing into it. The event goes on its stdin as one JSON line and in its environment
as `TFCTL_EVENT_<FIELD>`, so no run value is ever parsed by a shell. Commands run one at a time
on a thread of their own, each for at most `NOTIFY_TIMEOUT` seconds, so supervision never waits
for them; a command that fails is reported as one line and changes nothing about the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Callable, ClassVar, Mapping, Sequence

from tfctl import console
from tfctl.engine.events import EventKind
from tfctl.engine.reconcile import Notify
from tfctl.runs.record import RunRecord
from tfctl.supervisor.records import Wire, record

NOTIFY_TIMEOUT = 10.0  # seconds a notify command may take before it is killed
OUTPUT_SHOWN = 200  # characters of a failed command's last output line in its report
OUTPUT_KEPT = 64 * 1024  # bytes of a command's output kept, its last: one printing gigabytes costs nothing


@record
class RunEvent(Wire):
    """One event, as a notify command gets it: JSON on stdin, and `environment()`."""

    ENUMS: ClassVar[Mapping[str, type]] = {"kind": EventKind}

    kind: EventKind
    run_id: str
    cluster: str  # the cluster's name
    cluster_file: str
    time: float  # epoch seconds
    reason: str
    task: str | None = None  # the task it is about, if any
    host: str | None = None  # that task's host

    @classmethod
    def of(cls, run: RunRecord, kind: EventKind, reason: str, task: str | None = None) -> RunEvent:
        host = run.task(task).host if task is not None and any(t.name == task for t in run.tasks) else None
        return cls(kind, run.run_id, run.cluster_name, run.cluster_file, time.time(), reason, task, host)

    def environment(self) -> dict[str, str]:
        """`TFCTL_EVENT_KIND=stalled`, ...: every field, empty when it has none."""
        return {f"TFCTL_EVENT_{k.upper()}": "" if v is None else str(v) for k, v in self.to_wire().items()}


def _to_stderr(line: str) -> None:
    # the terminal of an attached `up`, a watcher's watch.log; the command's words shown, not obeyed
    console.err().print(line, markup=False)


class Notifier:
    """Runs the `notify:` commands on each event sent, in order, on a thread of its own.

    `close` (or leaving its `with`) waits for the events already sent: a controller about to
    exit still delivers the run's end."""

    def __init__(
        self,
        commands: Sequence[str],
        cwd: Path | None = None,
        say: Callable[[str], None] = _to_stderr,
        timeout: float = NOTIFY_TIMEOUT,
    ) -> None:
        self.commands = tuple(commands)
        self.cwd = cwd
        self.say = say
        self.timeout = timeout  # for each command, before it is killed
        self._events: queue.SimpleQueue[RunEvent | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, run: RunRecord, say: Callable[[str], None] = _to_stderr) -> Notifier:
        """The run's commands, run in its cluster file's directory (if it still is one)."""
        folder = Path(run.cluster_file).parent
        return cls(run.notify, folder if folder.is_dir() else None, say)

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def tell(self, run: RunRecord, notice: Notify) -> None:
        """What the engine decided to tell, as the run's event: the one place events are made."""
        self.send(RunEvent.of(run, notice.kind, notice.reason, notice.task))

    def send(self, event: RunEvent) -> None:
        if not self.commands:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver, daemon=True, name="tfctl-notify")
                self._thread.start()
            self._events.put(event)

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._events.put(None)
        if thread is not None:
            thread.join()  # each command is bounded by `timeout`

    def _deliver(self) -> None:
        while (event := self._events.get()) is not None:
            for command in self.commands:
                failure = run_command(command, event, self.cwd, self.timeout)
                if failure is not None:
                    self.say(f"notify: `{command}` {failure} (event {event.kind} of run {event.run_id})")


def run_command(command: str, event: RunEvent, cwd: Path | None, timeout: float = NOTIFY_TIMEOUT) -> str | None:
    """Run one notify command with the event; None if it succeeded, else how it failed."""
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **event.environment()},
            start_new_session=True,  # its own group: a timeout kills whatever it started too
        )
    except OSError as e:
        return f"could not start: {e.strerror}"
    assert proc.stdin is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout
    stdin = (json.dumps(event.to_wire()) + "\n").encode()
    threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    kept = bytearray()
    reader = threading.Thread(target=_keep_last, args=(proc.stdout, kept), daemon=True)
    reader.start()
    reader.join(timeout)  # until the command and all it started closed its output
    try:
        if reader.is_alive():
            raise subprocess.TimeoutExpired(command, timeout)
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()  # (its reader ends when the last holder of its output does: it is not waited for)
        return f"did not finish within {timeout:g}s: killed"
    out = bytes(kept)
    if proc.returncode == 0:
        return None
    code = proc.returncode
    end = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    last = out.decode("utf-8", "replace").strip().splitlines()[-1:]
    return end + (f": {last[0][:OUTPUT_SHOWN]}" if last else "")


def _feed(stdin: IO[bytes], data: bytes) -> None:
    """The event to a command's stdin, on a thread: one that never reads it blocks nothing."""
    with contextlib.suppress(OSError):  # BrokenPipeError: it did not read it
        with stdin:
            stdin.write(data)


def _keep_last(stdout: IO[bytes], kept: bytearray) -> None:
    """Read a command's output to its end, keeping its last OUTPUT_KEPT bytes in `kept`."""
    with stdout:
        while chunk := os.read(stdout.fileno(), 65536):
            kept += chunk
            if len(kept) > 2 * OUTPUT_KEPT:  # trimmed now and then, not on every chunk
                del kept[:-OUTPUT_KEPT]
    del kept[:-OUTPUT_KEPT]
