"""Runs whose controller dies: the hosts end them alone, and the next tfctl command takes over.

Real CLI processes on a localhost cluster of stand-in tasks; the controller (an attached `up` or
a detached watcher) is SIGKILLed, as when a laptop dies or a session is cut.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from bench.waiting import wait_until
from tests.conftest import fake, free_ports, port_listening, spawn_tfctl, tfctl, wait_for_line
from tests.test_cli_localhost import latest_run, run_processes, write_cluster
from tfctl.controller.live.watcher import is_running
from tfctl.runs.store import RunStore


def statuses(cluster: Path, home: Path) -> dict[str, dict]:
    result = tfctl("status", "--json", "-f", str(cluster), home=home)
    assert result.returncode == 0, result.stderr
    return {t["task"]: t for t in json.loads(result.stdout)["tasks"]}


def wait_run_ended(home: Path, run_id: str, timeout: float = 20):
    store = RunStore(home)
    over = f"run {run_id} recorded as over"
    return wait_until(lambda: store.load(run_id), timeout, over, until=lambda r: not r.active, interval=0.2)


def test_a_killed_attached_up_leaves_nothing_running_once_its_lease_runs_out(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake(f"--name w{{task_index}} --port $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]})) --sleep -1"),
        extra="lease_timeout: 2",
    )
    up = spawn_tfctl("up", "-f", str(cluster), home=home, stdout=subprocess.DEVNULL)
    try:
        assert up.stderr is not None
        wait_for_line(up.stderr, "following", 30)
        run_id = latest_run(home)
        assert len(run_processes(run_id)) == 5
        time.sleep(3)  # deliberately past one lease period: the live controller renews it, nothing stops
        assert len(run_processes(run_id)) == 5
    finally:
        up.kill()  # the laptop's lid closes
        up.wait()
    killed_at = time.monotonic()
    wait_until(lambda: run_processes(run_id) == [], 10, "every task stopped by its host", interval=0.2)
    assert time.monotonic() - killed_at >= 1.5  # not before the lease ran out
    assert not any(port_listening(p) for p in ports)

    status = tfctl("status", "-f", str(cluster), home=home)
    # Every task had ended: the first answer says how the run ended, not `(running)` and a lease.
    assert "`tfctl up` that started it" in status.stderr and "its job had ended: recorded as stopped" in status.stderr
    assert "(running)" not in status.stdout and "(stopped" in status.stdout
    record = wait_run_ended(home, run_id)
    assert record.state.value == "stopped"
    assert "was stopped by its host" in (record.reason or "") and "no controller for" in (record.reason or "")
    tasks = statuses(cluster, home)
    assert {t["state"] for t in tasks.values()} == {"stopped"}
    assert all("no controller for" in (t["stop_reason"] or "") for t in tasks.values())


def test_with_its_watcher_killed_a_detached_run_trains_on_and_its_ps_stops_alone(tmp_path: Path, home: Path) -> None:
    ports = free_ports(3)
    cluster = write_cluster(
        tmp_path,
        ports,
        fake(f"--name ps --port {ports[0]} --sleep -1"),
        fake(
            f"--name w{{task_index}} --port $(({ports[1]} + {{task_index}} * {ports[2] - ports[1]})) "
            "--sleep $((6 - {task_index}))"
        ),
        extra="idle_ps_timeout: 1\nlease_timeout: 1",
    )
    up = tfctl("up", "-d", "-f", str(cluster), home=home)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.strip()
    store = RunStore(home)
    watcher = store.load(run_id).watcher
    assert watcher is not None and not watcher.attached
    os.kill(watcher.pid, signal.SIGKILL)
    wait_until(lambda: not is_running(watcher), 5, "the watcher's death", interval=0.2)
    time.sleep(2)  # deliberately past the lease: a detached run has none, the workers go on
    assert set(statuses_quiet(store, run_id)) == {"running"}

    # The workers finish; nothing of tfctl runs anywhere, yet the ps must not outlive them.
    wait_until(lambda: run_processes(run_id) == [], 20, "the ps stopped by its host", interval=0.2)
    assert not any(port_listening(p) for p in ports)

    status = tfctl("status", "-f", str(cluster), home=home)
    assert "its watcher" in status.stderr and "its job had ended: recorded as succeeded" in status.stderr
    assert "(running)" not in status.stdout
    record = wait_run_ended(home, run_id)
    assert record.state.value == "succeeded", record.reason
    tasks = statuses(cluster, home)
    assert [tasks[t]["state"] for t in ("ps:0", "worker:0", "worker:1")] == ["stopped", "succeeded", "succeeded"]
    assert "(worker:0 gone" in tasks["ps:0"]["stop_reason"]  # the decisive task of `success_policy: chief`
    again = tfctl("status", "-f", str(cluster), home=home)
    assert again.returncode == 0 and "warning" not in again.stderr  # the run is over: nothing to resume


def statuses_quiet(store: RunStore, run_id: str) -> list[str]:
    """Task states without a CLI command, which would start a new watcher."""
    from tfctl.cluster.cluster import Cluster

    with Cluster(store.load(run_id)) as cluster:
        return [s.state.value for s in cluster.status()[0]]
