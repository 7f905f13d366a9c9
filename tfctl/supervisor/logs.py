"""Task output: the last lines for diagnosis, and the byte-exact follow stream."""

from __future__ import annotations

import os
import re
import time
from typing import BinaryIO, Dict, Iterator, List, Optional, Tuple

from .files import task_dir
from .inotify import ALL, Changes
from .marks import TERMINAL_CODES
from .protocol import TailAnswer, TailRequest, TaskInfo
from .state import task_state
from .stream import FollowEvent, FollowRequest, Heartbeat, LogChunk, TaskEnded
from .timeline import Timeline

CHUNK = 256 * 1024
MAX_PARTIAL_LINE = 64 * 1024
HEARTBEAT = 5.0
STATE_EVERY = 1.0  # a task's state is read again at least this often while followed
FOLLOW_POLL = 0.1  # seconds between reads of a followed log that grows (its lines then come in blocks)
LOG_FILES = {"output.log", "output.times"}  # changes to these say nothing of the state
MAX_TAIL_BYTES = 4 * 1024 * 1024


def output_log(root: str, run_id: str, task: str) -> str:
    return os.path.join(task_dir(root, run_id, task), "output.log")


def tail_offset(path: str, lines: int, within: Optional[int] = None) -> int:
    """Byte offset where the last `lines` lines of the file begin; with `within`, no earlier than
    that many bytes before its end (what is before is not even read)."""
    try:
        f = open(path, "rb")
    except OSError:
        return 0
    with f:
        f.seek(0, 2)
        pos = f.tell()
        end = pos
        if lines <= 0:
            return end  # `--tail 0`: nothing of what is there, only what comes
        floor = 0 if within is None else max(0, end - within)
        newlines = 0
        while pos > floor:
            step = min(65536, pos - floor)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            if pos + step == end and block.endswith(b"\n"):
                block = block[:-1]
            i = len(block)
            while True:  # newlines found from the end in C: a 20 MB line is read, not looped over
                i = block.rfind(b"\n", 0, i)
                if i < 0:
                    break
                newlines += 1
                if newlines == lines:
                    return pos + i + 1
        return floor


def _last_line_end(data: bytes) -> int:
    """Index of the last \\n or \\r (-1: none): a progress bar's states end at \\r."""
    return max(data.rfind(b"\n"), data.rfind(b"\r"))


def since_offset(path: str, moment: float) -> int:
    """Where the first line written after `moment` begins."""
    with Timeline(path) as timeline:
        offset = timeline.offset_at(moment)
    if offset == 0:
        return 0
    try:
        with open(path, "rb") as f:
            f.seek(offset - 1)
            while True:  # a line the moment cut in two starts before it: begin after its end
                block = f.read(65536)
                if not block:
                    return offset
                newline = block.find(b"\n")
                if newline >= 0:
                    return offset - 1 + newline + 1 if newline else offset
                offset += len(block)
    except OSError:
        return 0


def output_written(path: str, count_lines: bool = False) -> Tuple[Optional[float], Optional[int]]:
    """When the task last wrote to its log (None: never) and, if asked, how many lines it holds:
    reading the whole log costs, so only the end of a run and a silence about to be named ask."""
    try:
        written = os.stat(path).st_mtime
    except OSError:
        return None, None
    if not count_lines:
        return written, None
    lines = 0
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                lines += block.count(b"\n")
    except OSError:
        return written, None
    return written, lines


def last_line(path: str) -> str:
    """The last non-blank line of a file (what `status` shows of a task's progress)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read()
    except OSError:
        return ""
    # A progress bar redrawn in place (`\r`, backspaces) shows its latest state.
    for line in reversed(re.split(rb"[\r\n]", TERMINAL_CODES.sub(b"", tail))):
        if line.strip():
            return line.decode(errors="replace").strip()
    return ""


def tail(root: str, request: TailRequest) -> TailAnswer:
    """The last `lines` lines of several tasks' output, in one answer (for diagnosis), from at
    most its last MAX_TAIL_BYTES: after a huge line, what came after it is what matters."""
    tails: Dict[str, List[str]] = {}
    for task in request.tasks:
        path = output_log(root, request.run_id, task)
        try:
            with open(path, "rb") as f:
                f.seek(tail_offset(path, request.lines, MAX_TAIL_BYTES))
                tails[task] = f.read(MAX_TAIL_BYTES).decode("utf-8", errors="replace").splitlines()
        except OSError:
            tails[task] = []
    return TailAnswer(tails)


class _Source:
    """One followed task: its log, how far it was read, and what is known of its state."""

    def __init__(self, root: str, run_id: str, task: str, offset: int) -> None:
        self.path = output_log(root, run_id, task)
        self.offset = offset
        self.file: Optional[BinaryIO] = None
        self.state: Optional[TaskInfo] = None
        self.checked = -STATE_EVERY  # when the state was last read (monotonic)
        self.stale = True  # a state file changed since: read the state again
        self.watched = False

    def read(self) -> bytes:
        if self.file is None:
            try:
                self.file = open(self.path, "rb")
            except OSError:
                return b""
        self.file.seek(self.offset)
        return self.file.read(CHUNK)


def _whole_lines(data: bytes, complete: bool) -> bytes:
    """What of a block to hand out: whole lines; a partial last line waits for its end unless
    `complete` (the task is over, or this is not a follow), the block is full (more follows) or
    the line is absurdly long. A progress bar redrawn in place ends its states with \r: those go
    out as they come, so the bar moves live instead of appearing once its line ends."""
    cut = _last_line_end(data) + 1
    if cut and (len(data) == CHUNK or not complete):
        return data[:cut]
    if not cut and not complete and len(data) < MAX_PARTIAL_LINE:
        return b""
    return data


def follow(root: str, request: FollowRequest) -> Iterator[FollowEvent]:
    """Task output from byte offsets, in blocks of whole lines.

    Each chunk carries the byte offset it ends at, so a reader that loses the stream resumes
    exactly there: nothing is lost and nothing repeats. With `follow`, the stream goes on until
    every task has ended and its output is drained; each task's end is announced once. Between
    reads it sleeps until a task's directory changes (inotify), or polls where that is not to be
    had; a task's state is read again only when its files changed, and once a STATE_EVERY.
    """
    run_id = request.run_id
    offsets = {t: int(o) for t, o in request.tasks.items()}
    if request.tail is not None:
        count = int(request.tail)
        offsets = {t: max(o, tail_offset(output_log(root, run_id, t), count)) for t, o in offsets.items()}
    if request.since is not None:
        moment = time.time() - float(request.since)
        offsets = {t: max(o, since_offset(output_log(root, run_id, t), moment)) for t, o in offsets.items()}
    sources = {t: _Source(root, run_id, t, o) for t, o in offsets.items()}
    changes = Changes.open() if request.follow else None
    last_beat = time.monotonic()
    try:
        while sources:
            progressed = False
            for task in sorted(sources):
                source = sources[task]
                now = time.monotonic()
                # Read the state before the data: output written before the task ended is then
                # always read before its end is announced.
                if request.follow and (source.stale or now - source.checked >= STATE_EVERY):
                    source.state, source.checked, source.stale = task_state(root, run_id, task), now, False
                final = source.state is not None and source.state.state.is_final
                data = _whole_lines(source.read(), final or not request.follow)
                if data:
                    start, source.offset = source.offset, source.offset + len(data)
                    stamps = None
                    if request.times:
                        with Timeline(source.path) as timeline:
                            stamps = [[size, at] for size, at in timeline.stamps(start, source.offset)]
                    yield LogChunk(task, source.offset, data, stamps)
                    progressed = True
                    continue
                if request.follow and source.state is not None and final:
                    yield TaskEnded(task, source.offset, source.state.state)
                if not request.follow or final:
                    _forget(sources.pop(task))
            if not request.follow or progressed:
                continue
            if time.monotonic() - last_beat > HEARTBEAT:
                yield Heartbeat(time.time())
                last_beat = time.monotonic()
            _wait(root, run_id, sources, changes)
    finally:
        for source in sources.values():
            _forget(source)
        if changes is not None:
            changes.close()


def _forget(source: _Source) -> None:
    if source.file is not None:
        source.file.close()


def _wait(root: str, run_id: str, sources: Dict[str, _Source], changes: Optional[Changes]) -> None:
    """Until some task's files changed (at most STATE_EVERY), then FOLLOW_POLL more so that a
    task printing line by line is read in blocks; only FOLLOW_POLL without inotify or while a
    task has no directory yet. Marks the tasks whose state files changed."""
    if changes is not None:
        for task, source in sources.items():
            if not source.watched:
                source.watched = changes.watch(task, task_dir(root, run_id, task))
    if changes is None or not all(s.watched for s in sources.values()):
        time.sleep(FOLLOW_POLL)
        return
    changed = changes.wait(STATE_EVERY)
    stale = set(sources) if ALL in changed else {task for task, names in changed.items() if not names <= LOG_FILES}
    for task in stale & set(sources):
        sources[task].stale = True
    if changed:
        time.sleep(FOLLOW_POLL)
