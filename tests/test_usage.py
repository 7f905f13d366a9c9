"""What a task's process tree uses, read from /proc (`supervisor.usage`), against real busy and
idle processes on this machine, and GPUs through a stand-in nvidia-smi."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench.waiting import wait_until
from tfctl.runs.accounting import TaskCost, cost_json, hours_text, wall_seconds
from tfctl.supervisor import usage
from tfctl.supervisor.protocol import TaskLaunch, Usage

# Spins, with one spinning child, each writing the CPU time it used itself (time.process_time,
# the kernel's account through another door than /proc/PID/stat) to its own file.
SPINNER = """
import os, subprocess, sys, time
out = sys.argv[1]
if sys.argv[2] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[3], out + ".child", "child", ""])
n = 0
while True:
    n += 1
    if n % 20000 == 0:
        with open(out + ".tmp", "w") as f:
            f.write(repr(time.process_time()))
        os.replace(out + ".tmp", out)
"""


def kill_tree(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[tuple[int, list[Path]]]:
    """A spinning process with a spinning child: (its pid, the files the two report CPU time in)."""
    own = tmp_path / "cpu"
    child = subprocess.Popen([sys.executable, "-c", SPINNER, str(own), "parent", SPINNER])
    files = [own, Path(f"{own}.child")]
    try:
        wait_until(lambda: all(f.exists() for f in files), 10, "both spinners to report")
        yield child.pid, files
    finally:
        kill_tree(usage.procfs.descendants(child.pid))
        child.wait()


def vm_rss(pids: list[int]) -> int:
    """Resident bytes as /proc/PID/status says (kB), summed."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
    return total


def test_a_busy_trees_cpu_percent_and_memory_match_what_its_processes_report(busy) -> None:
    pid, files = busy
    reported = lambda: sum(float(f.read_text()) for f in files)  # noqa: E731
    seconds, _rss, pids = usage.tree_usage(pid)
    then, own_then = time.time(), reported()
    time.sleep(2.0)
    later, rss, pids = usage.tree_usage(pid)
    now, own_now = time.time(), reported()
    assert len(pids) == 2
    measured = usage.cpu_percent(later, seconds, now, then)
    truth = 100 * (own_now - own_then) / (now - then)
    assert truth > 5  # it did spin (two spinners on 2 cores shared with other work: up to 200)
    assert abs(measured - truth) <= 0.3 * truth, (measured, truth)
    assert abs(rss - vm_rss(pids)) <= 0.3 * vm_rss(pids)


def test_an_idle_tree_uses_no_cpu_and_its_memory_is_counted() -> None:
    idle = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        assert idle.stdout is not None and idle.stdout.readline() == b"ready\n"
        seconds, _, _ = usage.tree_usage(idle.pid)
        then = time.time()
        time.sleep(1.0)
        later, rss, pids = usage.tree_usage(idle.pid)
        assert usage.cpu_percent(later, seconds, time.time(), then) < 2.0
        assert pids == [idle.pid] and abs(rss - vm_rss(pids)) <= 0.3 * vm_rss(pids)
    finally:
        idle.kill()
        idle.wait()


def test_the_monitors_notes_are_read_back_and_a_restart_hides_the_ones_before(tmp_path: Path) -> None:
    log = str(tmp_path / "output.log")
    notes = usage.UsageNotes(log, [])
    idle = subprocess.Popen(["sleep", "60"])
    try:
        # The kernel folds a new process's page counts into what /proc shows in batches: a moment.
        wait_until(lambda: usage.tree_usage(idle.pid)[1] > 0, 10, "sleep's resident pages counted", interval=0.01)
        notes.begin(idle.pid, time.time() - usage.USAGE_EVERY)
        notes.note()  # due: USAGE_EVERY seconds since it began
        notes.note()  # not due again yet
        notes.sample(time.time())
        restart = time.time()
        notes.begin(idle.pid, restart)
        notes.sample(time.time())
    finally:
        idle.kill()
        idle.wait()
    records = usage.read_usage(log)
    assert len(records) == 3 and all(r.rss_bytes > 0 and r.gpu_util_percent is None for r in records)
    assert [r.sampled_at for r in records] == sorted(r.sampled_at for r in records)
    assert usage.read_usage(log, last=2) == records[1:]
    assert usage.current_usage(log, restart) == records[-1]
    assert usage.read_usage(log, since=restart) == records[-1:]
    assert os.path.getsize(usage.usage_path(log)) == 3 * usage.RECORD.size


def stand_in_nvidia_smi(directory: Path, pid: int) -> None:
    """An nvidia-smi that answers the two queries the monitor makes: GPUs 0-2 busy 10, 30, 90 %,
    `pid` holding 1500 MiB and another process 700 MiB."""
    script = directory / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=index,utilization.gpu) printf '0, 10\\n1, 30\\n2, 90\\n' ;;
  --query-compute-apps=pid,used_memory) printf '{pid}, 1500\\n99999999, 700\\n4, [N/A]\\n' ;;
  *) echo "unexpected query: $*" >&2; exit 2 ;;
esac
""")
    script.chmod(0o755)


def test_gpu_usage_is_the_tasks_gpus_and_its_own_processes_memory(tmp_path: Path, monkeypatch) -> None:
    stand_in_nvidia_smi(tmp_path, 4242)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert usage.gpu_usage([0, 1], [4242, 5]) == (20.0, 1500 * 1024 * 1024)
    assert usage.gpu_usage([2], [5]) == (90.0, 0)
    launch = TaskLaunch("worker:0", "x", env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert usage.visible_gpus(launch.env) == [0, 1] and usage.visible_gpus({}) == []


def test_a_task_with_gpus_has_their_usage_in_its_notes(tmp_path: Path, monkeypatch) -> None:
    idle = subprocess.Popen(["sleep", "60"])
    try:
        stand_in_nvidia_smi(tmp_path, idle.pid)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
        log = str(tmp_path / "output.log")
        notes = usage.UsageNotes(log, [1, 2])
        notes.begin(idle.pid, time.time())
        notes.sample(time.time())
    finally:
        idle.kill()
        idle.wait()
    (sample,) = usage.read_usage(log)
    assert (sample.gpu_util_percent, sample.gpu_memory_bytes) == (60.0, 1500 * 1024 * 1024)


def test_without_nvidia_smi_a_task_has_no_gpu_figures(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert usage.gpu_usage([0], [1]) == (None, None)


def write_samples(log: Path, count: int) -> list[Usage]:
    samples = [Usage(float(i), 1.0, i) for i in range(count)]
    with open(usage.usage_path(str(log)), "wb") as f:
        for u in samples:
            f.write(usage.RECORD.pack(u.sampled_at, u.cpu_percent, u.rss_bytes, -1.0, -1))
    return samples


def test_a_whole_life_of_samples_is_thinned_evenly_keeping_the_newest(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    samples = write_samples(log, 1000)
    kept = usage.read_usage_points(str(log), 200)
    assert 200 <= len(kept) <= 201 and kept[0] == samples[0] and kept[-1] == samples[-1]
    assert {b.sampled_at - a.sampled_at for a, b in zip(kept, kept[1:-1])} == {5.0}
    assert usage.read_usage_points(str(tmp_path / "none.log"), 200) == []
    assert usage.read_usage_points(str(log), 2000) == samples


def test_a_huge_usage_file_costs_only_the_points_read(tmp_path: Path) -> None:
    # a month's run, or a file someone filled on the host: 100 million records (3.2 GB, sparse)
    log = tmp_path / "output.log"
    with open(usage.usage_path(str(log)), "wb") as f:
        f.truncate(100_000_000 * usage.RECORD.size)
    started = time.monotonic()
    assert len(usage.read_usage_points(str(log), 200)) == 201
    assert time.monotonic() - started < 2


def burnt(pid: int, seconds: float) -> bool:
    return usage.tree_usage(pid)[0] >= seconds


def test_the_monitor_counts_cpu_seconds_over_every_run_of_the_task(tmp_path: Path) -> None:
    """A task that burns CPU, is restarted and burns again: its total holds both runs, and a
    monitor taking over the task counts on from it."""
    log = str(tmp_path / "output.log")
    notes = usage.UsageNotes(log, [])
    totals = []
    for _ in range(2):
        busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
        try:
            notes.begin(busy.pid, time.time())
            wait_until(functools.partial(burnt, busy.pid, 0.3), 20, "0.3 s of CPU", interval=0.05)
            notes.sample(time.time())
            totals.append(usage.read_cpu_total(log))
        finally:
            busy.kill()
            busy.wait()
    first, both = totals
    assert first is not None and both is not None
    assert 0.3 <= first < 5 and both >= first + 0.3
    assert usage.UsageNotes(log, []).earlier == both


def test_a_runs_cost_is_wall_time_cpu_and_gpu_hours_per_task_and_in_total() -> None:
    costs = [TaskCost("ps:0", 3600.0, 360.0, 0), TaskCost("worker:0", 1800.0, 5400.0, 2)]
    assert cost_json(costs, 3700.0) == {
        "tasks": {
            "ps:0": {"wall_seconds": 3600.0, "cpu_hours": 0.1, "gpu_hours": 0.0},
            "worker:0": {"wall_seconds": 1800.0, "cpu_hours": 1.5, "gpu_hours": 1.0},
        },
        "total": {"wall_seconds": 3700.0, "cpu_hours": 1.6, "gpu_hours": 1.0, "unmeasured": []},
    }
    unmeasured = cost_json([TaskCost("ps:1", 10.0, None, 0), *costs], 3700.0)["total"]
    assert (unmeasured["cpu_hours"], unmeasured["unmeasured"]) == (1.6, ["ps:1"])  # said, not left out
    assert wall_seconds([(100.0, 160.0), (170.0, None)], now=200.0) == 90.0  # a restart, then running
    assert [hours_text(h) for h in (None, 44 / 3600, 0.25, 3.2)] == ["-", "44 s", "15.0 min", "3.20 h"]
