"""TF failures tfctl must explain and end, with real TensorFlow processes on localhost."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, REPO, free_ports, marked_processes, tfctl, wait_for_line

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
]
MNIST = REPO / "examples" / "mnist"
WORKER = (
    "{python} train.py --job_name=worker --task_index={task_index} --ps_hosts={ps_hosts} "
    "--worker_hosts={worker_hosts} --train_steps 100000000"
)


def run_left(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


def test_worker_whose_ps_is_gone_is_diagnosed_then_failed_as_hung(tmp_path: Path, home: Path) -> None:
    ps_port, w_port = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    # The ps listens long enough to pass start-up, then exits: the worker's CreateSession waits forever.
    cluster.write_text(f"""name: hang
workdir: {MNIST}
fail_on_ps_exit: false
hang_timeout: 20
grace_period: 3
jobs:
  ps:
    hosts: [localhost:{ps_port}]
    command: "{{python}} {FAKE_TASK} --name ps --port {ps_port} --sleep 1"
  worker:
    hosts: [localhost:{w_port}]
    command: "{WORKER}"
""")
    up = tfctl("-f", str(cluster), "up", "-d", home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()

    def worker() -> dict:
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        return next(t for t in tasks if t["task"] == "worker:0")

    seen = wait_until(
        worker,
        60,
        "a diagnosis of worker:0",
        until=lambda w: w["state"] != "running" or w["diagnosis"] is not None,
        interval=1,
    )
    diagnosis = seen["diagnosis"] if seen["state"] == "running" else None
    assert diagnosis is not None, seen
    assert diagnosis["kind"] == "waiting_for_peer" and diagnosis["peer"] == "ps:0"
    assert "CreateSession still waiting for response from worker: /job:ps/replica:0/task:0" in diagnosis["evidence"]
    assert f"ps:0 (localhost:{ps_port}), but ps:0 exited with code 0 at" in diagnosis["cause"]
    # TF never gives up; tfctl's watcher does, naming the hang and its cause.
    record = wait_until(
        lambda: json.loads(tfctl("runs", "--json", home=home).stdout)[-1],
        60,
        "the run's end",
        until=lambda record: record["state"] != "running",
        interval=1,
    )
    assert record["state"] == "failed", record
    assert "worker:0 has been stuck for over 20s" in record["reason"] and "ps:0" in record["reason"]
    assert run_left(run_id) == []


def test_ps_killed_mid_run_fails_the_job_naming_the_ps(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"""name: pskill
workdir: {MNIST}
grace_period: 3
command: "{WORKER.replace("--job_name=worker", "--job_name={job_name}")}"
jobs:
  ps: [localhost:{ports[0]}]
  worker: [localhost:{ports[1]}, localhost:{ports[2]}]
""")
    up = subprocess.Popen(
        [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TFCTL_HOME": str(home)},
    )
    assert up.stdout is not None
    try:
        wait_for_line(up.stdout, "[worker:0] step ", 90)  # training started
        tasks = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)["tasks"]
        ps_pid = next(t["pid"] for t in tasks if t["task"] == "ps:0")
        os.kill(ps_pid, signal.SIGKILL)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 1
    assert "job failed: ps:0 on localhost was killed by signal 9" in err
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    assert run_left(run_id) == []
