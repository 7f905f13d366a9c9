"""`status --json`'s CPU and memory of each task, on simulated SSH hosts (real sshd in network
namespaces, bench/netns_hosts.py), against /proc read here for a busy and an idle task.

The lab has its own prefix, bridge and subnet, so it runs beside the other modules' labs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.netns_hosts import TestHost, make_lab_fixture
from bench.waiting import wait_until
from tests.conftest import tfctl
from tests.test_ssh_cluster import PORT, host_task_dir, no_leftovers, write_cluster
from tests.test_usage import vm_rss
from tfctl.supervisor import usage
from tfctl.supervisor.procfs import proc_env_markers

__all__ = ["no_leftovers"]  # a fixture: imported to be used here
pytestmark = pytest.mark.netns
lab = make_lab_fixture(2, scope="module", prefix="tfctl-u", bridge="tfctlbr31", subnet="10.77.31")
TICKS = os.sysconf("SC_CLK_TCK")
TOLERANCE = 0.3


def task_pids(host: TestHost, run_id: str, task: str) -> list[int]:
    """The task's processes as this machine numbers them (the host's PID namespace nests in ours)."""
    return [p for p in host.pids() if proc_env_markers(p) == (run_id, task)]


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes, read here from /proc/PID/stat."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


class Sampler:
    """CPU seconds of some processes, looked at here every 0.1 s, for the rate over any window."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.looks: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.1):
            self.looks.append((time.time(), cpu_seconds(self.pids)))

    def percent(self, begin: float, end: float) -> float:
        a = min(self.looks, key=lambda look: abs(look[0] - begin))
        b = min(self.looks, key=lambda look: abs(look[0] - end))
        assert abs(a[0] - begin) < 0.3 and abs(b[0] - end) < 0.3, "the window was not sampled here"
        return 100 * (b[1] - a[1]) / (b[0] - a[0])

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


@pytest.fixture
def run(tmp_path: Path, lab, no_leftovers) -> Iterator[dict[str, Any]]:
    """ps:0 on tfh0 sleeps; worker:0 on tfh1 spins on a core holding 64 MiB."""
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"
    jobs = f'  ps: [tfh0:{PORT}]\n  worker:\n    hosts: [tfh1:{PORT}]\n    command: "{command} --busy --hold-mb 64"'
    cluster = write_cluster(tmp_path, lab, jobs, command, name="usage")
    home = tmp_path / "home"
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    yield {"cluster": cluster, "home": home, "run_id": up.stdout.strip()}
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0, down.stderr


def status_tasks(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    ran = tfctl("-f", str(run["cluster"]), "status", "--json", home=run["home"])
    assert ran.returncode == 0, ran.stderr
    return {t["task"]: t for t in json.loads(ran.stdout)["tasks"]}


def test_status_json_cpu_and_memory_of_a_busy_and_an_idle_task_match_proc(run, lab) -> None:
    hosts = {"ps:0": lab.host("tfh0"), "worker:0": lab.host("tfh1")}
    pids = {task: task_pids(host, run["run_id"], task) for task, host in hosts.items()}
    assert all(pids.values()), pids
    samplers = {task: Sampler(p) for task, p in pids.items()}
    try:
        # Two of the monitor's samples after the sampling here began: a window seen from both sides.
        began = time.time()
        wait_until(
            lambda: [
                usage.read_usage(str(host_task_dir(h, run["run_id"], t) / "output.log"), since=began)
                for t, h in hosts.items()
            ],
            20,
            "two usage samples of each task",
            until=lambda found: all(len(samples) >= 2 for samples in found),
            interval=0.5,
        )
        tasks = status_tasks(run)
        rss_here = {task: vm_rss(p) for task, p in pids.items()}
    finally:
        for sampler in samplers.values():
            sampler.stop()
    for task, host in hosts.items():
        shown = tasks[task]
        samples = usage.read_usage(str(host_task_dir(host, run["run_id"], task) / "output.log"), since=began)
        # The sample status answered with, and the one before it: the window its CPU percent covers.
        at = max(i for i, s in enumerate(samples) if s.cpu_percent == shown["cpu_percent"])
        assert at >= 1, (task, shown["cpu_percent"], samples)
        here = samplers[task].percent(samples[at - 1].sampled_at, samples[at].sampled_at)
        if task == "worker:0":
            assert here > 5, here  # it spun (on 2 cores shared with other work: rarely a whole one)
            assert abs(shown["cpu_percent"] - here) <= TOLERANCE * here, (shown["cpu_percent"], here)
        else:
            assert here < 2 and shown["cpu_percent"] < 2, (shown["cpu_percent"], here)
        assert abs(shown["rss_bytes"] - rss_here[task]) <= TOLERANCE * rss_here[task], (shown, rss_here)
        assert shown["gpu_util_percent"] is None and shown["gpu_memory_bytes"] is None
    assert tasks["worker:0"]["rss_bytes"] > tasks["ps:0"]["rss_bytes"] + (50 << 20)  # its 64 MiB
