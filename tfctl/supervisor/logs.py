"""Task output: the last lines for diagnosis, and the byte-exact follow stream."""

from __future__ import annotations

import os
import re
import time
from typing import BinaryIO, Dict, Iterator, List

from .files import task_dir
from .marks import TERMINAL_CODES
from .protocol import FollowEvent, FollowRequest, Heartbeat, LogChunk, TailAnswer, TailRequest, TaskEnded
from .state import task_state
from .timeline import Timeline

CHUNK = 256 * 1024
MAX_PARTIAL_LINE = 64 * 1024
HEARTBEAT = 5.0
MAX_TAIL_BYTES = 4 * 1024 * 1024


def output_log(root: str, run_id: str, task: str) -> str:
    return os.path.join(task_dir(root, run_id, task), "output.log")


def tail_offset(path: str, lines: int) -> int:
    """Byte offset where the last `lines` lines of the file begin."""
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
        newlines = 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            if pos + step == end and block.endswith(b"\n"):
                block = block[:-1]
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 10:
                    newlines += 1
                    if newlines == lines:
                        return pos + i + 1
        return 0


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
    """The last `lines` lines of several tasks' output, in one answer (for diagnosis)."""
    tails: Dict[str, List[str]] = {}
    for task in request.tasks:
        path = output_log(root, request.run_id, task)
        try:
            with open(path, "rb") as f:
                f.seek(tail_offset(path, request.lines))
                tails[task] = f.read(MAX_TAIL_BYTES).decode("utf-8", errors="replace").splitlines()
        except OSError:
            tails[task] = []
    return TailAnswer(tails)


def follow(root: str, request: FollowRequest) -> Iterator[FollowEvent]:
    """Task output from byte offsets, complete lines only.

    Each chunk carries the byte offset it ends at, so a reader that loses the stream resumes
    exactly there: nothing is lost and nothing repeats. With `follow`, the stream goes on until
    every task has ended and its output is drained; each task's end is announced once.
    """
    run_id = request.run_id
    offsets = {t: int(o) for t, o in request.tasks.items()}
    if request.tail is not None:
        count = int(request.tail)
        offsets = {t: max(o, tail_offset(output_log(root, run_id, t), count)) for t, o in offsets.items()}
    if request.since is not None:
        moment = time.time() - float(request.since)
        offsets = {t: max(o, since_offset(output_log(root, run_id, t), moment)) for t, o in offsets.items()}
    files: Dict[str, BinaryIO] = {}
    open_tasks = set(offsets)
    last_beat = time.monotonic()
    try:
        while open_tasks:
            progressed = False
            for task in sorted(open_tasks):
                # Read the state before the data: output written before the task ended is then
                # always read before its end is announced.
                state = task_state(root, run_id, task).state
                final = state.is_final
                f = files.get(task)
                if f is None:
                    try:
                        f = files[task] = open(output_log(root, run_id, task), "rb")
                    except OSError:
                        f = None
                data = b""
                if f is not None:
                    f.seek(offsets[task])
                    data = f.read(CHUNK)
                if data:
                    # Hand out whole lines; a partial last line waits for its end unless the task is
                    # over, the read is a full chunk (more follows), or the line is absurdly long.
                    # A progress bar redrawn in place ends its states with \r: those go out as
                    # they come, so the bar moves live instead of appearing once its line ends.
                    cut = _last_line_end(data) + 1
                    complete = final or not request.follow
                    if cut and (len(data) == CHUNK or not complete):
                        data = data[:cut]
                    elif not cut and not complete and len(data) < MAX_PARTIAL_LINE:
                        data = b""
                if data:
                    start = offsets[task]
                    offsets[task] += len(data)
                    # `partial`: bytes after the last newline, so a reader that holds the partial
                    # line back knows the exact offset where that line starts.
                    partial = len(data) - _last_line_end(data) - 1
                    stamps = None
                    if request.times:
                        with Timeline(output_log(root, run_id, task)) as timeline:
                            stamps = [[size, at] for size, at in timeline.stamps(start, offsets[task])]
                    yield LogChunk(task, offsets[task], partial, data.decode("utf-8", errors="replace"), stamps)
                    progressed = True
                    continue
                if not request.follow or final:
                    if request.follow:
                        yield TaskEnded(task, offsets[task], state)
                    open_tasks.discard(task)
            if not request.follow:
                continue
            if not progressed:
                if time.monotonic() - last_beat > HEARTBEAT:
                    yield Heartbeat(time.time())
                    last_beat = time.monotonic()
                time.sleep(request.poll)
    finally:
        for f in files.values():
            f.close()
