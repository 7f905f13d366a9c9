"""A frozen host on the simulated SSH hosts: every process of one host SIGSTOPped, as a paused
VM or a hung NFS server leaves it. The healthy hosts train on, the run fails after host_timeout
naming that host, and the frozen host's tasks stop by their own lease once it thaws."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import spawn_tfctl, tfctl, wait_for_line
from tests.test_ssh_cluster import run_pids, write_cluster

pytestmark = pytest.mark.netns
JOBS = """  ps: [tfh0:2222]
  worker: [tfh1:2222, tfh2:2222, tfh3:2222]"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """4 hosts tfh0..tfh3, each with its own home."""
    require_netns()
    with TestHostLab(
        4, workdir=tmp_path_factory.mktemp("frozen-lab"), prefix="tfctl-fz", bridge="tfctlbr51", subnet="10.77.51"
    ) as lab:
        yield lab


def test_a_frozen_host_fails_an_attached_run_after_host_timeout_without_taking_the_healthy_ones_down(
    tmp_path: Path, home: Path, lab
) -> None:
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra="lease_timeout: 6\nhost_timeout: 12")
    up = spawn_tfctl("-f", str(cluster), "up", home=home, stdout=subprocess.DEVNULL)
    frozen = lab.host("tfh3")
    try:
        assert up.stderr is not None
        wait_for_line(up.stderr, "all 4 tasks running", 90)
        run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
        frozen.signal_all(signal.SIGSTOP)
        froze = time.monotonic()

        record = home / "runs" / run_id / "run.json"
        wait_until(lambda: json.loads(record.read_text())["unreachable"], 15, "the controller noting tfh3 silent")
        began = time.monotonic()
        shown = tfctl("-f", str(cluster), "status", home=home, timeout=60)
        asked = time.monotonic() - began
        assert asked < 10, asked  # the controller answers without waiting on the frozen host
        row = next(line for line in shown.stdout.splitlines() if line.startswith("worker:2"))
        assert re.search(r"unreachable \(since \d\d:\d\d:\d\d, \d+s\)", row), shown.stdout

        # Past the lease (6 s), before host_timeout (12 s): every healthy host's lease was renewed.
        wait_until(lambda: time.monotonic() - froze > 9, 15, "a time past the lease", interval=0.2)
        assert {"tfh0", "tfh1", "tfh2"} <= set(run_pids(lab, run_id)), run_pids(lab, run_id)

        killer = threading.Timer(60, up.kill)
        killer.start()
        assert up.stderr is not None
        rest = up.stderr.read()
        up.wait()
        killer.cancel()
        failed_after = time.monotonic() - froze
        assert up.returncode == 1
        # The promise, host_timeout + 10 s under 4 busy loops, is measured by bench.frozen_host; here
        # the suite's other worker runs its own tests beside this one, hence 5 s more.
        assert 12 <= failed_after < 12 + 15, failed_after
        assert re.search(r"lost contact with tfh3 since \d\d:\d\d:\d\d \(12s, host_timeout\)", rest), rest
        assert sorted(run_pids(lab, run_id)) == ["tfh3"]  # the rest stopped; tfh3 could not be told
    finally:
        frozen.signal_all(signal.SIGCONT)
        if up.poll() is None:
            up.kill()
            up.wait()
    # Thawed, its tasks find their lease long run out and stop by themselves.
    wait_until(lambda: run_pids(lab, run_id) == {}, 30, "the thawed host stopping its tasks", interval=0.2)
    print(f"healthy tasks ran on; up failed {failed_after:.1f}s after the freeze; status answered in {asked:.1f}s")
