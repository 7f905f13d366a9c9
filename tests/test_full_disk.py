"""A full disk under the supervisor's root, on a small tmpfs: the monitor outlives it holding its
task's end, `status` names it, `stop` still stops, and the end is written once space returns."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench.waiting import wait_until
from tfctl.supervisor import guard, procfs, tasks
from tfctl.supervisor.files import read_json, run_dir, task_dir
from tfctl.supervisor.protocol import StartRequest, StatusRequest, StopRequest, TaskLaunch, TaskState
from tfctl.supervisor.state import task_state

RUN = "disk-20261126-000000-1"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        give_back(disk)
        subprocess.run(["umount", str(disk)], check=True)


def give_back(disk: Path) -> None:
    """Free the disk and end whatever of the run a failed test left, by PID, so it unmounts."""
    (disk / "filler").unlink(missing_ok=True)
    root = str(disk / ".tfctl")
    proc = read_json(os.path.join(task_dir(root, RUN, "worker:0"), "proc.json"))
    if proc is None:
        return
    tasks.stop(root, StopRequest(RUN, 0.5))
    try:
        wait_until(lambda: not procfs.is_same_process(proc["monitor"]), 10, "the monitor to end")
    except AssertionError:
        os.kill(proc["monitor"]["pid"], signal.SIGKILL)


def fill(disk: Path) -> Path:
    """Write a file until the disk refuses more; returns it (remove it to give the space back)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def record(path: str) -> dict:
    found = read_json(path)
    assert isinstance(found, dict), path
    return found


def start(root: str, command: str, lease: float = 0.0) -> dict:
    answer = tasks.start(root, StartRequest(RUN, [TaskLaunch("worker:0", command, grace=1.0)], lease=lease))
    assert answer.tasks["worker:0"].state is TaskState.RUNNING, answer
    proc = read_json(os.path.join(task_dir(root, RUN, "worker:0"), "proc.json"))
    assert proc is not None
    return proc


def test_an_end_on_a_full_disk_is_held_by_its_monitor_and_written_once_space_returns(small_disk: Path) -> None:
    root = str(small_disk / ".tfctl")
    proc = start(root, "sleep 1; exit 3")
    d = task_dir(root, RUN, "worker:0")
    filler = fill(small_disk)

    info = wait_until(lambda: task_state(root, RUN, "worker:0"), 10, "the end", until=lambda i: i.state.is_final)
    assert (info.state, info.exit_code, info.unrecorded) == (TaskState.FAILED, 3, True)
    assert procfs.is_same_process(proc["monitor"]) and not os.path.exists(os.path.join(d, "exit.json"))
    shown = tasks.status(root, StatusRequest(RUN, {"worker:0": 0}))
    assert shown.disk.startswith(f"disk full under {root} (") and shown.tasks["worker:0"].exit_code == 3

    filler.unlink()
    wait_until(lambda: not procfs.is_same_process(proc["monitor"]), 10, "the monitor to write the end and go")
    assert record(os.path.join(d, "exit.json"))["exit_code"] == 3
    info = task_state(root, RUN, "worker:0")
    assert (info.state, info.exit_code, info.unrecorded) == (TaskState.FAILED, 3, False)
    assert "was full from" in Path(d, "output.log").read_text()
    assert tasks.status(root, StatusRequest(RUN, {"worker:0": 0})).disk == ""


def test_stop_on_a_full_disk_stops_the_task_and_the_stop_is_recorded_later(small_disk: Path) -> None:
    root = str(small_disk / ".tfctl")
    proc = start(root, "sleep 600")
    filler = fill(small_disk)

    done = tasks.stop(root, StopRequest(RUN, 1.0))
    assert done.remaining == [] and not procfs.is_same_process(proc)
    held = done.tasks["worker:0"]
    assert (held.state, held.signal, held.unrecorded) == (TaskState.STOPPED, 15, True)
    assert procfs.is_same_process(proc["monitor"])

    filler.unlink()
    wait_until(lambda: not procfs.is_same_process(proc["monitor"]), 10, "the monitor to write the stop and go")
    info = task_state(root, RUN, "worker:0")
    assert (info.state, info.signal, info.unrecorded) == (TaskState.STOPPED, 15, False)


def test_a_lease_is_renewed_on_a_full_disk(small_disk: Path) -> None:
    root = str(small_disk / ".tfctl")
    proc = start(root, "sleep 600", lease=30.0)
    try:
        path = os.path.join(run_dir(root, RUN), guard.LEASE_FILE)
        before = record(path)["renewed"]
        filler = fill(small_disk)
        time.sleep(0.05)  # deliberately: a renewal measurably later
        shown = tasks.status(root, StatusRequest(RUN, {"worker:0": 0}, renew_lease=True))
        assert shown.disk.startswith("disk full under") and record(path)["renewed"] > before
        filler.unlink()
    finally:
        tasks.stop(root, StopRequest(RUN, 1.0))
    wait_until(lambda: not procfs.is_same_process(proc["monitor"]), 10, "the monitor to end")
