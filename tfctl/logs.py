"""Task output from every host, merged into one stream of (task, line), live or after the fact.

One `follow` stream per host. Each chunk carries the byte offset it ends at; if a stream drops,
it is reopened from those offsets, so no line is lost or repeated whatever the volume.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import TYPE_CHECKING, Iterator, Sequence

from tfctl import console
from tfctl.errors import TfctlError
from tfctl.runs import TaskSpec
from tfctl.supervisor.protocol import FollowRequest, LogChunk, TaskEnded
from tfctl.supervisor.timeline import dated
from tfctl.transport.base import Stream

if TYPE_CHECKING:
    from tfctl.cluster import Cluster

RECONNECT_DELAY = 1.0


class LogFollower:
    """Reads the output of `tasks` from their hosts on background threads, one per host."""

    def __init__(
        self,
        cluster: Cluster,
        tasks: Sequence[TaskSpec],
        follow: bool,
        tail: int | None = None,
        since: float | None = None,
        timestamps: bool = False,
    ) -> None:
        """`since`: only lines written in the last this many seconds; `timestamps`: each line
        begins with when it was written (UTC, to the second, by its host's clock)."""
        self.cluster = cluster
        self.tasks = list(tasks)
        self.tail = tail
        self.since = since
        self.timestamps = timestamps
        self.offsets = {t.name: 0 for t in self.tasks}
        self.ended: set[str] = set()
        self.errors: list[str] = []
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=10000)
        self._backlog: collections.deque[tuple[str, str] | None] = collections.deque()
        self._stopping = threading.Event()
        self._streams: dict[str, Stream] = {}
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._spawn(follow)

    def _spawn(self, follow: bool) -> None:
        """One reader thread per host, for the tasks whose end has not been seen yet."""
        by_host: dict[str, list[TaskSpec]] = {}
        for t in self.tasks:
            if t.name not in self.ended:
                by_host.setdefault(t.host, []).append(t)
        self._threads = [
            threading.Thread(target=self._read_host, args=(host, tasks, follow), daemon=True)
            for host, tasks in by_host.items()
        ]
        self._running += len(self._threads)
        for thread in self._threads:
            thread.start()

    def _read_host(self, host: str, tasks: list[TaskSpec], follow: bool) -> None:
        first = True
        try:
            while not self._stopping.is_set():
                wanted = {t.name: self.offsets[t.name] for t in tasks if t.name not in self.ended}
                if not wanted:
                    break
                request = FollowRequest(
                    self.cluster.record.run_id,
                    wanted,
                    follow,
                    self.tail if first else None,
                    since=self.since if first else None,
                    times=self.timestamps,
                )
                first = False
                try:
                    self._read_stream(host, request, final=not follow)
                except (TfctlError, OSError, ValueError) as e:
                    if not follow:
                        self.errors.append(f"{host}: {getattr(e, 'message', e)}")
                if not follow:
                    break
                if any(t.name not in self.ended for t in tasks):
                    self._stopping.wait(RECONNECT_DELAY)
        finally:
            self._queue.put(None)  # this reader is done

    def _read_stream(self, host: str, request: FollowRequest, final: bool) -> None:
        """One connection's worth of events. A partial last line is held back and its offset not
        passed, so after a reconnect it is read again whole; `final` reads flush it instead."""
        partial: dict[str, str] = {}
        stream, events = self.cluster.agents[host].follow(request)
        self._streams[host] = stream
        for event in events:
            if isinstance(event, LogChunk):
                task = event.task
                held = partial.pop(task, "")
                *lines, rest = (held + event.data).split("\n")
                bar = ""
                if "\r" in rest:
                    bar, rest = rest.rsplit("\r", 1)
                shown, bar_state = [redrawn(line) for line in lines], redrawn(bar)
                if event.stamps is not None:
                    start = event.offset - len(event.data.encode()) - len(held.encode())
                    times = line_times([*lines, bar], start, event.stamps)
                    shown = [f"{utc(t)} {line}" for line, t in zip(shown, times)]
                    bar_state = f"{utc(times[-1])} {bar_state}" if bar_state else ""
                for line in shown:
                    self._queue.put((task, line))
                if bar_state:
                    self._queue.put((task, bar_state))  # the bar's latest state, while its line goes on
                if rest:
                    partial[task] = rest
                self.offsets[task] = event.offset - event.partial
            elif isinstance(event, TaskEnded):
                final_part = partial.pop(event.task, None)
                if final_part is not None:
                    self._queue.put((event.task, redrawn(final_part)))
                self.offsets[event.task] = event.offset
                self.ended.add(event.task)
        if final:
            for task, rest in partial.items():
                self._queue.put((task, redrawn(rest)))
                self.offsets[task] += len(rest.encode())

    def batches(self, idle: float = 0.2) -> Iterator[list[tuple[str, str]]]:
        """Yield lists of (task, line) as they arrive, an empty list after `idle` seconds of quiet,
        until every reader has ended."""
        while self._running:
            batch: list[tuple[str, str]] = []
            try:
                item = self._backlog.popleft() if self._backlog else self._queue.get(timeout=idle)
                while True:
                    if item is None:
                        self._running -= 1
                    else:
                        batch.append(item)
                    if len(batch) >= 500:
                        break
                    item = self._backlog.popleft() if self._backlog else self._queue.get_nowait()
            except (queue.Empty, IndexError):
                pass
            yield batch

    def finish(self) -> None:
        """Stop following and read what is left once, from the exact offsets reached.

        Closing a live stream may cut off lines the host had not sent yet; the catch-up read
        starts where the stream stopped, so nothing is lost and nothing repeats.
        """
        self._stop_readers()
        self._stopping.clear()
        self._spawn(follow=False)

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading now (Ctrl-C); `batches` ends once the readers notice."""
        self._stopping.set()
        for stream in list(self._streams.values()):
            stream.close()

    def _stop_readers(self) -> None:
        """Close the streams and wait for the readers, keeping whatever they still queue."""
        self.close()
        for thread in self._threads:
            while thread.is_alive():
                self._drain_to_backlog()
                thread.join(0.05)
        self._drain_to_backlog()

    def _drain_to_backlog(self) -> None:
        while True:
            try:
                self._backlog.append(self._queue.get_nowait())
            except queue.Empty:
                return


def redrawn(line: str) -> str:
    """What a terminal would show of a line redrawn in place with \\r and backspaces: its last
    state (the raw bytes stay in the task's log)."""
    if "\r" not in line and "\b" not in line:
        return line
    states = [s for s in line.replace("\b", "").split("\r") if s.strip()]
    return states[-1] if states else ""


def line_times(lines: list[str], start: int, stamps: list[list[float]]) -> list[float]:
    """When each line (the first begins at byte `start`) was written, by the host's [size, time]
    stamps (the last of them covers every line)."""
    time_of = dated(stamps, stamps[-1][1])
    out = []
    for line in lines:
        end = start + len(line.encode())
        out.append(time_of(end))
        start = end + 1
    return out


def utc(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


class Prefixer:
    """`[worker:1] ` prefixes, one colour per task, aligned; plain when colour is off (as
    `console.color_enabled` decides for the stream the lines go to)."""

    def __init__(self, names: Sequence[str], color: bool) -> None:
        width = max((len(n) for n in names), default=0) + 2
        self._prefix = {}
        for i, name in enumerate(names):
            text = f"[{name}]".ljust(width)
            colour = console.PALETTE[i % len(console.PALETTE)]
            self._prefix[name] = (console.paint(text, colour) if color else text) + " "

    def __call__(self, task: str, line: str) -> str:
        return self._prefix.get(task, f"[{task}] ") + line
