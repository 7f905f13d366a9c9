"""Task output from every host, merged into one stream of (task, line), live or after the fact.

One `follow` stream per host. Each chunk carries the byte offset it ends at; if a stream drops,
it is reopened from those offsets, so no line is lost or repeated whatever the volume.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from tfctl import console
from tfctl.errors import TfctlError
from tfctl.runs.record import TaskSpec
from tfctl.supervisor.stream import FollowRequest, LogChunk, TaskEnded
from tfctl.supervisor.timeline import dated
from tfctl.transport.base import Stream

if TYPE_CHECKING:
    from tfctl.cluster.cluster import Cluster

RECONNECT_DELAY = 1.0
# A line longer than this is shown (and held in memory) in pieces of at most this many bytes,
# each printed as a line of its own; the task's log keeps it whole.
LINE_BOUND = 64 * 1024
BATCH_LINES = 10000  # at most this many lines per batch handed to the caller
QUEUED_BLOCKS = 64  # blocks read ahead of the caller, each at most one chunk of a host's


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
        offsets: Mapping[str, int] | None = None,
    ) -> None:
        """`since`: only lines written in the last this many seconds; `timestamps`: each line
        begins with when it was written (UTC, to the second, by its host's clock); `offsets`:
        where to begin in a task's output (what an earlier follower of it had read)."""
        self.cluster = cluster
        self.tasks = list(tasks)
        self.tail = tail
        self.since = since
        self.timestamps = timestamps
        self.offsets = {t.name: (offsets or {}).get(t.name, 0) for t in self.tasks}
        self.ended: set[str] = set()
        self.errors: list[str] = []
        # Whole blocks (a task and its lines), not lines: one hand-over per block, not per line.
        self._queue: queue.Queue[tuple[str, list[str]] | None] = queue.Queue(maxsize=QUEUED_BLOCKS)
        self._backlog: collections.deque[tuple[str, list[str]] | None] = collections.deque()
        self._stopping = threading.Event()
        self._abandoned = threading.Event()  # `blocks` ends once what was read is handed over
        self._generation = 0  # readers of an earlier generation (stopped, still connecting) read nothing
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
            threading.Thread(target=self._read_host, args=(host, tasks, follow, self._generation), daemon=True)
            for host, tasks in by_host.items()
        ]
        self._running += len(self._threads)
        for thread in self._threads:
            thread.start()

    def _read_host(self, host: str, tasks: list[TaskSpec], follow: bool, generation: int) -> None:
        first = True
        try:
            while not self._stopping.is_set() and generation == self._generation:
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
                    self._read_stream(host, request, final=not follow, generation=generation)
                except (TfctlError, OSError, ValueError) as e:
                    if not follow:
                        self.errors.append(f"{host}: {getattr(e, 'message', e)}")
                if not follow:
                    break
                if any(t.name not in self.ended for t in tasks):
                    self._stopping.wait(RECONNECT_DELAY)
        finally:
            self._queue.put(None)  # this reader is done

    def _read_stream(self, host: str, request: FollowRequest, final: bool, generation: int) -> None:
        """One connection's worth of events. A partial last line is held back and its offset not
        passed, so after a reconnect it is read again whole; `final` reads flush it instead."""
        held: dict[str, bytes] = {}
        stream, events = self.cluster.agents[host].follow(request)
        if self._stopping.is_set() or generation != self._generation:  # stopped while it connected
            stream.close()
            return
        self._streams[host] = stream
        for event in events:
            if generation != self._generation:  # stopped, and its stream slow to notice the close
                return
            if isinstance(event, LogChunk):
                task = event.task
                data = held.pop(task, b"") + event.data
                lines, bar, rest = split_block(data)
                if event.stamps is not None:
                    raw = data[: len(data) - len(rest)].split(b"\n")
                    times = line_times([len(line) for line in raw], event.offset - len(data), event.stamps)
                    lines = [f"{utc(t)} {line}" for line, t in zip(lines, times)]
                    bar = f"{utc(times[-1])} {bar}" if bar else ""
                if lines:
                    self._queue.put((task, bounded(lines)))
                if bar:
                    self._queue.put((task, [bar]))  # the bar's latest state, while its line goes on
                pieces = []
                while len(rest) > LINE_BOUND:  # one huge line: shown in pieces, never held whole
                    cut = utf8_boundary(rest, LINE_BOUND)
                    pieces.append(rest[:cut].decode(errors="replace"))
                    rest = rest[cut:]
                if pieces:
                    self._queue.put((task, pieces))
                if rest:
                    held[task] = rest
                self.offsets[task] = event.offset - len(rest)
            elif isinstance(event, TaskEnded):
                rest = held.pop(event.task, b"")
                if rest:
                    self._queue.put((event.task, [redrawn(rest.decode(errors="replace"))]))
                self.offsets[event.task] = event.offset
                self.ended.add(event.task)
        if final:
            for task, rest in held.items():
                self._queue.put((task, [redrawn(rest.decode(errors="replace"))]))
                self.offsets[task] += len(rest)

    def blocks(self, idle: float = 0.2) -> Iterator[list[tuple[str, list[str]]]]:
        """Yield lists of (task, lines in order) as they arrive, an empty list after `idle`
        seconds of quiet, until every reader has ended."""
        while self._running:
            blocks: list[tuple[str, list[str]]] = []
            count = 0
            try:
                item = self._backlog.popleft() if self._backlog else self._queue.get(timeout=idle)
                while True:
                    if item is None:
                        self._running -= 1
                    else:
                        blocks.append(item)
                        count += len(item[1])
                    if count >= BATCH_LINES:
                        break
                    item = self._backlog.popleft() if self._backlog else self._queue.get_nowait()
            except (queue.Empty, IndexError):
                if not blocks and self._abandoned.is_set():
                    return
            yield blocks

    def batches(self, idle: float = 0.2) -> Iterator[list[tuple[str, str]]]:
        """`blocks`, as one (task, line) per line."""
        for blocks in self.blocks(idle):
            batch: list[tuple[str, str]] = []
            for task, lines in blocks:
                batch += zip(itertools.repeat(task), lines)
            yield batch

    def finish(self, deadline: float | None = None) -> None:
        """Stop following and read what is left once, from the exact offsets reached (waiting
        for the followers to stop until `deadline`, if given).

        Closing a live stream may cut off lines the host had not sent yet; the catch-up read
        starts where the stream stopped, so nothing is lost and nothing repeats.
        """
        self._stop_readers(deadline)
        self._stopping.clear()
        self._spawn(follow=False)

    def read_rest(self, patience: float) -> None:
        """`finish`, waiting at most `patience` seconds for that last read, then `abandon`: for
        tasks stopped to start anew, whose output is then a new one. A reader still connecting
        to a silent host is not waited for."""
        deadline = time.monotonic() + patience
        self.finish(deadline)
        self._join_readers(deadline)
        self.abandon()

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def abandon(self) -> None:
        """Stop reading, and let `blocks` end once what was read is handed over, without waiting
        for the readers still at it."""
        self._abandoned.set()
        self.close()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading now (Ctrl-C); `batches` ends once the readers notice."""
        self._stopping.set()
        for stream in list(self._streams.values()):
            stream.close()

    def _stop_readers(self, deadline: float | None = None) -> None:
        """Close the streams and wait for the readers (until `deadline`, if given), keeping
        whatever they still queue; those still at it then belong to a stopped generation."""
        self.close()
        self._join_readers(deadline)
        self._generation += 1

    def _join_readers(self, deadline: float | None) -> None:
        """Wait for the readers (until `deadline`), moving what they queue to the backlog so a
        full queue never blocks them."""
        for thread in self._threads:
            while thread.is_alive() and (deadline is None or time.monotonic() < deadline):
                self._drain_to_backlog()
                thread.join(0.05)
        self._drain_to_backlog()

    def _drain_to_backlog(self) -> None:
        while True:
            try:
                self._backlog.append(self._queue.get_nowait())
            except queue.Empty:
                return


def bounded(lines: list[str]) -> list[str]:
    """The lines, a longer one than LINE_BOUND in pieces of LINE_BOUND characters."""
    if max(map(len, lines), default=0) <= LINE_BOUND:  # one C-speed pass: this is every block's path
        return lines
    return [line[i : i + LINE_BOUND] for line in lines for i in range(0, max(len(line), 1), LINE_BOUND)]


def utf8_boundary(data: bytes, limit: int) -> int:
    """The largest cut at or below `limit` that splits no UTF-8 character."""
    cut = min(limit, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut or limit


def split_block(data: bytes) -> tuple[list[str], str, bytes]:
    """A block of output as (its whole lines as shown, the state of a bar redrawn in place on
    its unfinished last line, the bytes of that line after the bar's last redraw), with one
    decode and one split for the whole block: the per-line work is left to C."""
    cut = data.rfind(b"\n") + 1
    rest = data[cut:]
    text = data[:cut].decode(errors="replace")
    lines = text.split("\n")
    lines.pop()  # what follows the last newline: `rest`
    if "\r" in text or "\b" in text:
        lines = [redrawn(line) for line in lines]
    bar = ""
    redraw = rest.rfind(b"\r")
    if redraw >= 0:
        bar, rest = redrawn(rest[:redraw].decode(errors="replace")), rest[redraw + 1 :]
    return lines, bar, rest


def redrawn(line: str) -> str:
    """What a terminal would show of a line redrawn in place with \\r and backspaces: its last
    state (the raw bytes stay in the task's log)."""
    if "\r" not in line and "\b" not in line:
        return line
    states = [s for s in line.replace("\b", "").split("\r") if s.strip()]
    return states[-1] if states else ""


def line_times(lengths: list[int], start: int, stamps: list[list[float]]) -> list[float]:
    """When each line (of these lengths in bytes, the first beginning at byte `start`, one
    newline after each) was written, by the host's [size, time] stamps (the last of them covers
    every line)."""
    time_of = dated(stamps, stamps[-1][1])
    out = []
    for length in lengths:
        end = start + length
        out.append(time_of(end))
        start = end + 1
    return out


def utc(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


class Prefixer:
    """`[worker:1] ` prefixes, one colour per task, aligned; plain when colour is off (as
    `console.color_enabled` decides for the stream the lines go to). For a `terminal`, each line's
    control sequences are made inert (`console.inert`; SGR colours kept when colour is on)."""

    def __init__(self, names: Sequence[str], color: bool, terminal: bool = False) -> None:
        self._color, self._terminal = color, terminal
        width = max((len(n) for n in names), default=0) + 2
        self._prefix = {}
        for i, name in enumerate(names):
            text = f"[{name}]".ljust(width)
            colour = console.PALETTE[i % len(console.PALETTE)]
            self._prefix[name] = (console.paint(text, colour) if color else text) + " "

    def __call__(self, task: str, line: str) -> str:
        if self._terminal and console.has_controls(line):
            line = console.inert(line, self._color)
        return self._prefix.get(task, f"[{task}] ") + line

    def text(self, blocks: Iterable[tuple[str, list[str]]]) -> str:
        """Blocks of lines, each line prefixed and ended, with one join per block."""
        out = []
        for task, lines in blocks:
            if lines:
                prefix = self._prefix.get(task, f"[{task}] ")
                if self._terminal and console.has_controls("\n".join(lines)):
                    lines = [console.inert(line, self._color) for line in lines]
                out.append(prefix + ("\n" + prefix).join(lines) + "\n")
        return "".join(out)
