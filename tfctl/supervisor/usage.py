"""What a task costs its host: CPU and memory of its whole process tree from /proc, and, for a
task placed on GPUs, their utilisation and its processes' GPU memory from nvidia-smi.

CPU percent needs two looks at the tree's CPU time, so the task's monitor takes them: every
USAGE_EVERY seconds it appends one fixed-size record to output.usage next to output.log (the
history `tfctl top` draws and `read_usage` hands to anyone else), and `status` reads the last
record, a single seek, instead of sampling /proc twice per request. nvidia-smi costs a fraction
of a second of CPU, so it is asked only every GPU_EVERY seconds and only for a task with GPUs.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import procfs
from .protocol import Usage

# epoch seconds, CPU percent (100 = one core) since the previous record, resident bytes,
# GPU utilisation percent (-1: no GPU), GPU memory bytes of the task's processes (-1: no GPU)
RECORD = struct.Struct("<dfQfq")
TOTAL = struct.Struct("<d")  # CPU seconds of every run of the task so far
USAGE_EVERY = 3.0
GPU_EVERY = 10.0
NVIDIA_SMI_TIMEOUT = 5.0
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def usage_path(log_path: str) -> str:
    return log_path[: -len(".log")] + ".usage" if log_path.endswith(".log") else log_path + ".usage"


def cpu_total_path(log_path: str) -> str:
    """Where the monitor keeps the task's CPU seconds so far, every run of it together: one
    number, rewritten in place, so accounting costs `status` one small read, not the history."""
    return usage_path(log_path)[: -len(".usage")] + ".cpu"


def read_cpu_total(log_path: str) -> Optional[float]:
    """The task's CPU seconds over all its runs, as its monitor last counted; None: never counted."""
    try:
        with open(cpu_total_path(log_path), "rb") as f:
            data = f.read(TOTAL.size)
    except OSError:
        return None
    return TOTAL.unpack(data)[0] if len(data) == TOTAL.size else None


def tree_usage(pid: int) -> Tuple[float, int, List[int]]:
    """(CPU seconds, resident bytes, pids) of pid and every process below it. CPU seconds count
    the reaped children of each too (cutime, cstime), so a helper that ended still counts."""
    ticks, pages = 0, 0
    pids = procfs.descendants(pid)
    for each in pids:
        try:
            with open("/proc/%d/stat" % each, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        pages += int(fields[21])
    return ticks / TICKS, pages * PAGE, pids


def cpu_percent(seconds: float, earlier: float, now: float, then: float) -> float:
    """CPU percent between two looks; 0 when a process left the tree and took its time along."""
    if now <= then:
        return 0.0
    return max(0.0, 100.0 * (seconds - earlier) / (now - then))


def gpu_usage(gpus: Sequence[int], pids: Sequence[int]) -> Tuple[Optional[float], Optional[int]]:
    """(mean utilisation percent of `gpus`, GPU memory bytes held by `pids`) from nvidia-smi;
    (None, None) when it cannot say."""
    util = _smi("--query-gpu=index,utilization.gpu")
    apps = _smi("--query-compute-apps=pid,used_memory")
    if util is None:
        return None, None
    by_index = {int(row[0]): float(row[1]) for row in util if _numbers(row)}
    mine = [by_index[i] for i in gpus if i in by_index]
    wanted = set(pids)
    memory = None
    if apps is not None:
        memory = sum(int(float(row[1])) for row in apps if _numbers(row) and int(row[0]) in wanted) * 1024 * 1024
    return (sum(mine) / len(mine) if mine else None), memory


def _numbers(row: List[str]) -> bool:
    """Both leading values are numbers (nvidia-smi writes `[N/A]` or `[Not Supported]` otherwise)."""
    try:
        float(row[0]), float(row[1])
    except (ValueError, IndexError):
        return False
    return True


def _smi(query: str) -> Optional[List[List[str]]]:
    program = shutil.which("nvidia-smi")
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            timeout=NVIDIA_SMI_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    lines = done.stdout.decode(errors="replace").splitlines()
    return [[v.strip() for v in line.split(",")] for line in lines if line.strip()]


def visible_gpus(env: Dict[str, str]) -> List[int]:
    """The GPUs a task was placed on (its CUDA_VISIBLE_DEVICES, nvidia-smi's indices)."""
    return [int(v) for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip().isdigit()]


class UsageNotes:
    """The monitor's side: `begin` for each run of the task, then `note` as often as it likes;
    a record is written every USAGE_EVERY seconds (`sample` writes one at once)."""

    def __init__(self, log_path: str, gpus: Sequence[int]) -> None:
        self.path = usage_path(log_path)
        self.total_path = cpu_total_path(log_path)
        self.earlier = read_cpu_total(log_path) or 0.0  # CPU seconds of the runs before this one
        self.gpus = list(gpus)
        self.pid = 0
        self.last = (0.0, 0.0)  # (time, CPU seconds) of the previous look
        self.gpu: Tuple[Optional[float], Optional[int]] = (None, None)
        self.gpu_at = 0.0

    def begin(self, pid: int, started_at: float) -> None:
        """A new process: its CPU time counts from its start, after the earlier runs'."""
        if self.pid:
            self.earlier += self.last[1]
        self.pid = pid
        self.last = (started_at, 0.0)
        self.gpu_at = 0.0

    def note(self) -> None:
        now = time.time()
        if self.pid and now - self.last[0] >= USAGE_EVERY:
            self.sample(now)

    def sample(self, now: float) -> None:
        """One record of the current process's usage at `now` (epoch), and the CPU total."""
        seconds, rss, pids = tree_usage(self.pid)
        percent = cpu_percent(seconds, self.last[1], now, self.last[0])
        self.last = (now, seconds)
        if self.gpus and now - self.gpu_at >= GPU_EVERY:
            self.gpu, self.gpu_at = gpu_usage(self.gpus, pids), now
        util, memory = self.gpu
        record = RECORD.pack(now, percent, rss, -1.0 if util is None else util, -1 if memory is None else memory)
        try:
            with open(self.path, "ab") as f:
                f.write(record)
            fd = os.open(self.total_path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, TOTAL.pack(self.earlier + seconds), 0)
            finally:
                os.close(fd)
        except OSError:
            pass  # a full disk costs the history, never the task


def read_usage(log_path: str, last: Optional[int] = None, since: float = 0.0) -> List[Usage]:
    """The task's usage records, oldest first: all of them, or the `last` ones; only those taken
    at or after `since` (epoch). The reader for anyone who wants a task's CPU and memory over time."""
    try:
        with open(usage_path(log_path), "rb") as f:
            count = os.fstat(f.fileno()).st_size // RECORD.size
            first = 0 if last is None else max(0, count - last)
            f.seek(first * RECORD.size)
            data = f.read((count - first) * RECORD.size)
    except OSError:
        return []
    return [_usage(fields) for fields in RECORD.iter_unpack(data) if fields[0] >= since]


def read_usage_points(log_path: str, points: int) -> List[Usage]:
    """At most about `points` of the task's usage records over its whole life, evenly spread, the
    newest always among them; only those are read, however long the file (a month's run, or one
    someone filled on the host)."""
    try:
        with open(usage_path(log_path), "rb") as f:
            count = os.fstat(f.fileno()).st_size // RECORD.size
            step = max(1, -(-count // max(points, 1)))
            indexes = list(range(0, count, step))
            if count and indexes[-1] != count - 1:
                indexes.append(count - 1)
            found = []
            for index in indexes:
                f.seek(index * RECORD.size)
                found.append(_usage(RECORD.unpack(f.read(RECORD.size))))
            return found
    except (OSError, struct.error):  # struct.error: it shrank meanwhile
        return []


def _usage(fields: Tuple[float, float, int, float, int]) -> Usage:
    stamp, percent, rss, util, memory = fields
    return Usage(stamp, round(percent, 1), rss, None if util < 0 else round(util, 1), None if memory < 0 else memory)


def current_usage(log_path: str, started_at: Optional[float]) -> Optional[Usage]:
    """The latest record of the task's current run (none from before a restart, nor a stale one)."""
    found = read_usage(log_path, last=1, since=started_at or 0.0)
    if not found or time.time() - found[0].sampled_at > 3 * max(USAGE_EVERY, GPU_EVERY):
        return None
    return found[0]
