"""Spare hosts on the simulated SSH hosts: a worker's host freezes (every process SIGSTOPped),
and after host_timeout its task starts on the spare and the job finishes there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import tfctl, wait_for_line
from tests.test_frozen_ssh import signal_host
from tests.test_ssh_cluster import run_pids, write_cluster

pytestmark = pytest.mark.netns
HOST_TIMEOUT = 4
JOBS = """  ps:
    hosts: [tfh0:2222]
    command: "{python} fake_task.py --name ps0 --port 2222 --sleep -1"
  worker: [tfh1:2222, tfh2:2222]"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """4 hosts tfh0..tfh3: ps, two workers, a spare."""
    require_netns()
    with TestHostLab(4, workdir=tmp_path_factory.mktemp("spares-lab")) as lab:
        yield lab


def test_a_frozen_workers_host_hands_its_task_to_the_spare_and_the_job_finishes(
    tmp_path: Path, home: Path, lab
) -> None:
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep 25"
    extra = f"lease_timeout: 6\nhost_timeout: {HOST_TIMEOUT}\nspares: [tfh3]"
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra=extra)
    up = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    frozen = lab.host("tfh2")
    try:
        assert up.stderr is not None
        wait_for_line(up.stderr, "all 3 tasks running", 90)
        run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
        assert "tfh3" not in run_pids(lab, run_id)  # a spare runs nothing until needed
        signal_host(frozen, signal.SIGSTOP)
        froze = time.monotonic()
        wait_until(lambda: "tfh3" in run_pids(lab, run_id), 30, "worker:1 running on the spare", interval=0.1)
        moved_after = time.monotonic() - froze
        shown = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, timeout=60).stdout)
        [move] = shown["run"]["moves"]
        assert (move["task"], move["from_host"], move["to_host"], move["restarted"]) == ("worker:1", "tfh2", "tfh3", [])
        assert shown["run"]["spares"] == []
        row = next(t for t in shown["tasks"] if t["task"] == "worker:1")
        assert (row["host"], row["state"]) == ("tfh3", "running"), row
        table = tfctl("-f", str(cluster), "status", home=home, timeout=60).stdout
        assert "moved from tfh2 at " in next(line for line in table.splitlines() if line.startswith("worker:1"))
        assert up.stderr is not None
        rest = up.stderr.read()
        assert up.wait(timeout=90) == 0, rest
        assert "moving worker:1 to spare tfh3" in rest and "job succeeded" in rest, rest
    finally:
        signal_host(frozen, signal.SIGCONT)
        if up.poll() is None:
            up.kill()
            up.wait()
    # Thawed, its old worker finds its lease long run out and stops by itself.
    wait_until(lambda: run_pids(lab, run_id) == {}, 30, "the thawed host stopping its task", interval=0.2)
    assert HOST_TIMEOUT <= moved_after < HOST_TIMEOUT + 10, moved_after
    print(f"worker:1 running on the spare {moved_after:.1f}s after its host froze (host_timeout {HOST_TIMEOUT}s)")
