"""Task output from every host, merged into one stream of (task, line), live or after the fact.

One `follow` stream per host. Each chunk carries the byte offset it ends at; if a stream drops,
it is reopened from those offsets, so no line is lost or repeated whatever the volume.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator, Sequence

from tfctl.errors import TfctlError
from tfctl.runs import TaskSpec

RECONNECT_DELAY = 1.0
_DONE = object()

PALETTE = ("36", "33", "35", "32", "34", "91", "96", "93", "95", "92", "94")


class LogFollower:
    """Reads the output of `tasks` from their hosts on background threads."""

    def __init__(self, cluster, tasks: Sequence[TaskSpec], follow: bool, tail: int | None = None,
                 offsets: dict[str, int] | None = None) -> None:
        self.cluster = cluster
        self.tasks = list(tasks)
        self.follow = follow
        self.tail = tail
        self.offsets = {t.name: (offsets or {}).get(t.name, 0) for t in self.tasks}
        self.ended: set[str] = set()
        self.errors: list[str] = []
        self._queue: queue.Queue = queue.Queue(maxsize=10000)
        self._stopping = threading.Event()
        self._streams: dict[str, object] = {}
        self._threads = []
        by_host: dict[str, list[TaskSpec]] = {}
        for t in self.tasks:
            by_host.setdefault(t.host, []).append(t)
        for host, host_tasks in by_host.items():
            thread = threading.Thread(target=self._read_host, args=(host, host_tasks), daemon=True)
            self._threads.append(thread)
        self._running = len(self._threads)
        for thread in self._threads:
            thread.start()

    def _read_host(self, host: str, tasks: list[TaskSpec]) -> None:
        partial: dict[str, str] = {}
        first = True
        try:
            while not self._stopping.is_set():
                wanted = {t.name: self.offsets[t.name] for t in tasks if t.name not in self.ended}
                if not wanted:
                    break
                payload = {"run_id": self.cluster.record.run_id, "tasks": wanted, "follow": self.follow}
                if first and self.tail is not None:
                    payload["tail"] = self.tail
                first = False
                try:
                    stream, events = self.cluster.agents[host].follow(payload)
                    self._streams[host] = stream
                    for event in events:
                        task = event.get("t")
                        if task is None:
                            continue
                        if "d" in event:
                            text = partial.pop(task, "") + event["d"]
                            *lines, rest = text.split("\n")
                            if rest:
                                partial[task] = rest
                            for line in lines:
                                self._queue.put((task, line))
                            self.offsets[task] = event["o"]
                        if "end" in event:
                            if task in partial:
                                self._queue.put((task, partial.pop(task)))
                            self.ended.add(task)
                except (TfctlError, OSError, ValueError) as e:
                    if not self.follow:
                        self.errors.append(f"{host}: {getattr(e, 'message', e)}")
                        break
                if not self.follow:
                    break
                if not self._stopping.wait(RECONNECT_DELAY if any(t.name not in self.ended for t in tasks) else 0):
                    continue
        finally:
            for task, rest in partial.items():
                self._queue.put((task, rest))
            self._queue.put(_DONE)

    def batches(self, idle: float = 0.2) -> Iterator[list[tuple[str, str]]]:
        """Yield lists of (task, line) as they arrive, an empty list after `idle` seconds of quiet,
        until every stream has ended (or `stop` was called and the streams drained)."""
        while self._running:
            batch = []
            try:
                item = self._queue.get(timeout=idle)
                while True:
                    if item is _DONE:
                        self._running -= 1
                    else:
                        batch.append(item)
                    if len(batch) >= 500:
                        break
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            yield batch

    def close(self) -> None:
        """Stop reading: close every stream; `batches` then ends once the readers notice."""
        self._stopping.set()
        for stream in list(self._streams.values()):
            stream.close()


class Prefixer:
    """`[worker:1] ` prefixes, one colour per task, aligned; plain when colour is off."""

    def __init__(self, names: Sequence[str], color: bool) -> None:
        width = max((len(n) for n in names), default=0) + 2
        self._prefix = {}
        for i, name in enumerate(names):
            text = f"[{name}]".ljust(width)
            self._prefix[name] = f"\x1b[{PALETTE[i % len(PALETTE)]}m{text}\x1b[0m " if color else f"{text} "

    def __call__(self, task: str, line: str) -> str:
        return self._prefix.get(task, f"[{task}] ") + line
