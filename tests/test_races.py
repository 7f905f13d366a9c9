"""Two commands typed at once: one run per cluster file, decided atomically, and a `down` typed
while `up -d` starts stops the run being started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.waiting import wait_until
from tests.conftest import fake, free_ports, marked_processes, spawn_tfctl, tfctl
from tests.fake_runs import end
from tests.fakes import record_of
from tfctl.errors import UsageError
from tfctl.runs import transitions
from tfctl.runs.store import RunStore
from tfctl.supervisor.protocol import RunState


def test_of_two_claims_after_the_same_check_only_the_first_records_a_run(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "home")
    first, second = record_of({"worker:0": "h"}, run_id="a"), record_of({"worker:0": "h"}, run_id="b")
    transitions.claim(store, first, cleared=None)
    with pytest.raises(UsageError) as refused:
        transitions.claim(store, second, cleared=None)
    assert "run a of cluster 'fake' was started by another `tfctl up` at the same moment" in refused.value.message
    assert refused.value.hint is not None and "down --run a" in refused.value.hint
    assert [r.run_id for r in store.all()] == ["a"]
    end(store, "a", RunState.SUCCEEDED, "done")
    transitions.claim(store, second, cleared=None)  # an ended run is no obstacle
    assert [r.run_id for r in store.all()] == ["a", "b"]


def cluster_file(tmp_path: Path) -> Path:
    ps, worker = free_ports(2)
    path = tmp_path / "cluster.yaml"
    path.write_text(f"""name: race
grace_period: 1
jobs:
  ps:
    hosts: [localhost:{ps}]
    command: "{fake(f"--name ps --port {ps} --sleep -1")}"
  worker:
    hosts: [localhost:{worker}]
    command: "{fake(f"--name w --port {worker} --sleep -1")}"
""")
    return path


def launch(cluster: Path, home: Path, *args: str) -> subprocess.Popen:
    return spawn_tfctl("-f", str(cluster), *args, home=home)


def run_processes(run_id: str) -> list[int]:
    return [pid for pid, (_, run) in marked_processes().items() if run == run_id]


def stored_runs(home: Path) -> list[dict]:
    return json.loads(tfctl("runs", "--json", home=home).stdout)


@pytest.mark.parametrize("attempt", range(4))
def test_two_up_d_of_one_file_at_once_start_one_run_and_status_and_down_address_it(
    tmp_path: Path, home: Path, attempt: int
) -> None:
    cluster = cluster_file(tmp_path)
    both = [launch(cluster, home, "up", "-d"), launch(cluster, home, "up", "-d")]
    results = [(p.wait(120), *p.communicate()) for p in both]
    won = [r for r in results if r[0] == 0]
    lost = [r for r in results if r[0] != 0]
    assert len(won) == 1 and len(lost) == 1, results
    run_id = won[0][1].strip()
    assert run_id in lost[0][2] and "down" in lost[0][2], lost[0][2]  # the run to stop, and how
    runs = [r for r in stored_runs(home) if r["state"] in ("starting", "running")]
    assert [r["run_id"] for r in runs] == [run_id]
    status = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home).stdout)
    assert status["run"]["id"] == run_id and {t["state"] for t in status["tasks"]} == {"running"}
    down = tfctl("-f", str(cluster), "down", home=home)
    assert down.returncode == 0 and f"run {run_id}:" in down.stderr, down.stderr
    assert run_processes(run_id) == []


def test_down_typed_while_up_d_starts_stops_the_run_being_started(tmp_path: Path, home: Path) -> None:
    """`up -d` records its run before it forks and starts anything: a `down` typed from then on
    stops that run, never the previous one. (One typed before `up -d` has even read its cluster
    file, a few tenths of a second after it was typed, cannot know of it.)"""
    cluster = cluster_file(tmp_path)
    previous = tfctl("-f", str(cluster), "up", "-d", home=home)  # a run to mistake for the current one
    assert previous.returncode == 0 and tfctl("-f", str(cluster), "down", home=home).returncode == 0
    before = {r.run_id for r in RunStore(home).all()}
    starting = launch(cluster, home, "up", "-d")
    recorded = wait_until(
        lambda: [r for r in RunStore(home).all() if r.run_id not in before], 30, "the new run recorded", interval=0.01
    )
    assert recorded[0].active, recorded[0]  # recorded as starting (or, on a fast machine, running already)
    down = tfctl("-f", str(cluster), "down", home=home)
    starting.communicate(timeout=120)
    newest = stored_runs(home)[-1]
    assert newest["run_id"] == recorded[0].run_id
    assert f"run {newest['run_id']}:" in down.stderr, down.stderr  # not the previous run
    assert down.returncode == 0, down.stderr
    assert newest["state"] == "stopped", newest
    wait_until(lambda: run_processes(newest["run_id"]) == [], 10, "every task of the new run gone", interval=0.1)
