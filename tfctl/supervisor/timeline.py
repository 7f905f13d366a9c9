"""When each part of a task's output was written, to within a second, at no cost per line.

The task writes its output.log itself (its stdout is the file), so nothing sees its lines as they
are written. Instead its monitor notes the log's size once a second when it grew: output.times
holds fixed-size records (time, size), sorted by both. A byte written at offset o was written
before the first record whose size exceeds o, and after the one before it. `logs --since`,
`logs --timestamps` and the steps/s in `status` all read their times from here.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from typing import BinaryIO, Callable, List, Optional, Sequence, Tuple

RECORD = struct.Struct("<dQ")  # epoch seconds, log size in bytes


def times_path(log_path: str) -> str:
    return log_path[: -len(".log")] + ".times" if log_path.endswith(".log") else log_path + ".times"


class TimeNotes:
    """The monitor's side: append a record when the log grew since the last one."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self.path = times_path(log_path)
        self.last_size = -1
        last = _last_record(self.path)
        if last is not None:
            self.last_size = last[1]  # a restarted monitor goes on from its predecessor's record

    def note(self) -> None:
        try:
            size = os.stat(self.log_path).st_size
        except OSError:
            return
        if size == self.last_size:
            return
        try:
            with open(self.path, "ab") as f:
                f.write(RECORD.pack(time.time(), size))
        except OSError:
            return  # a full disk: the next note, once it takes one, dates this output a little later
        self.last_size = size


def _last_record(path: str) -> Optional[Tuple[float, int]]:
    try:
        with open(path, "rb") as f:
            count = os.fstat(f.fileno()).st_size // RECORD.size
            return _read(f, count - 1) if count else None
    except OSError:
        return None


def _read(f: BinaryIO, i: int) -> Tuple[float, int]:
    f.seek(i * RECORD.size)
    stamp, size = RECORD.unpack(f.read(RECORD.size))
    return stamp, size


def dated(stamps: Sequence[Sequence[float]], after_last: float) -> Callable[[int], float]:
    """When the byte before an offset was written, from (size, time) stamps in order: the time of
    the first stamp whose size is past the offset (`after_last` when none is)."""
    sizes = [stamp[0] for stamp in stamps]

    def time_of(offset: int) -> float:
        i = bisect.bisect_right(sizes, offset)
        return stamps[i][1] if i < len(stamps) else after_last

    return time_of


class Timeline:
    """The reader's side: times of offsets and offsets of times, by binary search on the file."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self._file: Optional[BinaryIO] = None
        try:
            self._file = open(times_path(log_path), "rb")
            self.count = os.fstat(self._file.fileno()).st_size // RECORD.size
        except OSError:
            self.count = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _record(self, i: int) -> Tuple[float, int]:
        assert self._file is not None
        return _read(self._file, i)

    def _first(self, key: int, value: float) -> int:
        """Index of the first record whose field `key` (0: time, 1: size) exceeds `value`."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if self._record(mid)[key] > value:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def time_of(self, offset: int) -> float:
        """When the byte at `offset` had been written (at the latest): a record's time, or the
        log's modification time for what was written after the last record."""
        i = self._first(1, offset)
        if i < self.count:
            return self._record(i)[0]
        try:
            return os.stat(self.log_path).st_mtime
        except OSError:
            return time.time()

    def offset_at(self, moment: float) -> int:
        """The log's size at `moment`: everything from there on was written after it."""
        i = self._first(0, moment)
        return self._record(i - 1)[1] if i > 0 else 0

    def dater(self, start: int, end: int) -> Callable[[int], float]:
        """`time_of` for many offsets in (start, end], from the records read once."""
        records = self.records(start, end)
        after_last = self.time_of(end) if not records or records[-1][0] <= end else records[-1][1]
        return dated(records, after_last)

    def stamps(self, start: int, end: int) -> List[Tuple[int, float]]:
        """`records(start, end)`, ending with one that covers `end` (the log's modification time
        when the monitor has not noted that far yet)."""
        out = self.records(start, end)
        if not out or out[-1][0] < end:
            out.append((end, self.time_of(end)))
        return out

    def records(self, start: int, end: int) -> List[Tuple[int, float]]:
        """(size, time) of the records with start < size <= end, and the first one past `end`:
        enough for a reader to date every line that ends in (start, end]."""
        out = []
        i = self._first(1, start)
        while i < self.count:
            stamp, size = self._record(i)
            out.append((size, stamp))
            if size > end:
                break
            i += 1
        return out
