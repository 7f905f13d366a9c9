"""`tfctl sweep` end to end through the real CLI, on localhost trials of small Python tasks: a
3 x 2 grid zipped with 2 seeds, one trial failing by its parameters; SIGKILL of every tfctl
process of the sweep, then `--resume`; `down --sweep`; and the inputs refused before any start."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, tfctl
from tfctl.runs.record import RunRecord
from tfctl.runs.store import RunStore
from tfctl.supervisor.procfs import is_same_process

# A trial's tasks listen on the port tfctl chose (`--port -1`), run `sleep` seconds, and the chief
# prints the final line its `acc` gives; the trial with acc 0.7, lr 0.01 and seed 2 exits 3.
COMMAND = (
    "{python} %s --name {job_name}{task_index} --port -1 --lines 1 --sleep {params.sleep} "
    '--exit $(test "{params.acc}/{params.lr}/{params.seed}" = 0.7/0.01/2 && echo 3 || echo 0) '
    '&& echo "final test accuracy {params.acc} after 10 global steps"' % FAKE_TASK
)


# A task that ran before in its trial's files (a resumed trial) ends at once; a first one runs 30 s.
RESUMING = (
    'mark="$TFCTL_RUN_DIR/begun-{job_name}{task_index}"; '
    "{python} %s --name {job_name}{task_index} --port -1 --lines 1 "
    '--sleep $(test -e "$mark" && echo 0.2 || echo 30) & touch "$mark"; wait $!' % FAKE_TASK
)


def write_cluster(
    tmp_path: Path, sweep: str, sleep: float = 0.3, hosts: str = "[localhost, localhost]", command: str = COMMAND
) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"""name: sw
grace_period: 2
command: {json.dumps(command)}
params: {{acc: 0.5, lr: 0.1, seed: 0, sleep: {sleep}}}
jobs:
  worker: {hosts}
sweep: {sweep}
"""
    )
    return path


def sweep_status(cluster: Path, home: Path, *args: str) -> dict[str, Any]:
    shown = tfctl("-f", str(cluster), "sweep", "status", "--json", *args, home=home)
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


def trial_runs(home: Path) -> dict[int, list[RunRecord]]:
    found: dict[int, list[RunRecord]] = {}
    for run in RunStore(home).all():
        assert run.trial is not None
        found.setdefault(run.trial, []).append(run)
    return found


def most_at_once(runs: list[RunRecord]) -> int:
    """The most runs whose lives (recorded to ended) overlapped."""
    edges = sorted([(r.created_at, 1) for r in runs] + [(r.ended_at or float("inf"), -1) for r in runs])
    at_once = most = 0
    for _, change in edges:
        at_once += change
        most = max(most, at_once)
    return most


def test_twelve_trials_three_at_a_time_one_failing_by_its_parameters(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(
        tmp_path, "{grid: {acc: [0.9, 0.8, 0.7], lr: [0.1, 0.01]}, zip: {seed: [1, 2]}, max_parallel: 3}"
    )
    swept = tfctl("-f", str(cluster), "sweep", home=home, timeout=300)
    assert swept.returncode == 1, swept.stderr  # one trial failed
    assert "12 trials, 3 at a time" in swept.stderr and "failed: 11" in swept.stderr

    table = sweep_status(cluster, home, "--sort", "accuracy")
    trials = table["trials"]
    assert len(trials) == 12 and table["best"] == trials[0]["trial"] and trials[0]["params"]["acc"] == 0.9
    failed = [t for t in trials if t["state"] == "failed"]
    assert [t["params"] for t in failed] == [{"acc": 0.7, "lr": 0.01, "seed": 2}]
    assert "exit" in failed[0]["why"] and "3" in failed[0]["why"]  # its cause: the code its tasks exited with
    ok = [t for t in trials if t["state"] == "succeeded"]
    assert len(ok) == 11 and all(t["metrics"]["accuracy"] == {"value": t["params"]["acc"], "step": 10} for t in ok)
    assert all(t["wall_seconds"] is not None for t in ok)

    runs = trial_runs(home)
    assert sorted(runs) == list(range(12)) and all(len(r) == 1 for r in runs.values())  # every trial ran once
    every = [r for rs in runs.values() for r in rs]
    assert most_at_once(every) <= 3
    assert all(r.left_nothing for r in every)  # each stop proved nothing of its trial left
    by_params = {json.dumps(t["params"], sort_keys=True): t["run_id"] for t in trials}
    for run in every:  # a trial's run ran with its parameters, as `status` and `runs` show them
        assert by_params[json.dumps({k: run.params[k] for k in ("acc", "lr", "seed")}, sort_keys=True)] == run.run_id
    listed = json.loads(tfctl("runs", "--json", home=home).stdout)
    assert len(listed) == 12 and {r["params"]["seed"] for r in listed} == {1, 2}

    plain = tfctl("-f", str(cluster), "sweep", "status", home=home)  # the table, as a person reads it
    assert plain.returncode == 0 and "failed:" in plain.stdout and plain.stdout.count("succeeded") == 11


def test_sigkill_of_every_tfctl_process_mid_sweep_then_resume_runs_every_trial_once(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(tmp_path, "{grid: {acc: [0.9, 0.8, 0.6], seed: [1, 2]}, max_parallel: 2}", sleep=2)
    started = tfctl("-f", str(cluster), "sweep", "-d", home=home)
    assert started.returncode == 0, started.stderr
    sweep_id = started.stdout.strip()
    record_path = home / "sweeps" / sweep_id / "sweep.json"
    wait_until(
        lambda: sweep_status(cluster, home)["trials"],
        60,
        "a trial done and two running",
        until=lambda trials: (
            [t["state"] for t in trials].count("succeeded") >= 1 and [t["state"] for t in trials].count("running") == 2
        ),
        interval=0.2,
    )
    driver = json.loads(record_path.read_text())["driver"]
    watchers = wait_until(  # (a trial just started records its watcher a moment after its run)
        lambda: [r.watcher for r in RunStore(home).all() if r.active and r.watcher is not None],
        30,
        "both running trials' watchers recorded",
        until=lambda found: len(found) == 2,
        interval=0.1,
    )
    victims = [driver, *[{"pid": w.pid, "starttime": w.starttime} for w in watchers]]
    assert len(victims) == 3
    for victim in victims:
        os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: not any(is_same_process(v) for v in victims), 10, "the killed processes gone")

    resumed = tfctl("-f", str(cluster), "sweep", "--resume", home=home, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    trials = sweep_status(cluster, home)["trials"]
    assert [t["state"] for t in trials] == ["succeeded"] * 6
    for index, runs in trial_runs(home).items():  # each trial ran to its end once: no second start
        assert [r.state.value for r in runs if not r.cut_off] == ["succeeded"], (index, runs)
        assert all(r.state.value == "failed" for r in runs if r.cut_off)


def test_down_sweep_stops_every_trial_and_resume_goes_on_from_their_files(tmp_path: Path, home: Path) -> None:
    cluster = write_cluster(tmp_path, "{grid: {acc: [0.9, 0.8, 0.6]}, max_parallel: 2}", command=RESUMING)
    started = tfctl("-f", str(cluster), "sweep", "-d", home=home)
    assert started.returncode == 0, started.stderr
    sweep_id = started.stdout.strip()
    wait_until(
        lambda: sweep_status(cluster, home)["trials"],
        60,
        "two trials running",
        until=lambda trials: [t["state"] for t in trials].count("running") == 2,
        interval=0.2,
    )
    down = tfctl("down", "--sweep", sweep_id, home=home, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "2 trials stopped" in down.stderr
    table = sweep_status(cluster, home)
    assert table["state"] == "stopped" and [t["state"] for t in table["trials"]] == ["stopped", "stopped", "pending"]
    runs = trial_runs(home)
    assert sorted(runs) == [0, 1] and all(r[0].left_nothing for r in runs.values())  # the third never started

    again = tfctl("-f", str(cluster), "sweep", "-d", "--resume", sweep_id, home=home)
    assert again.returncode == 0, again.stderr
    wait_until(
        lambda: [t["state"] for t in sweep_status(cluster, home)["trials"]],
        60,
        "the stopped trials done from their files, the third running",
        until=lambda states: states == ["succeeded", "succeeded", "running"],
        interval=0.2,
    )
    runs = trial_runs(home)
    assert [len(runs[i]) for i in range(3)] == [2, 2, 1]
    assert [runs[i][1].resumes for i in (0, 1)] == [runs[0][0].run_id, runs[1][0].run_id]  # from their files
    assert tfctl("down", "--sweep", sweep_id, home=home, timeout=120).returncode == 0
    assert all(not r.active and r.left_nothing for r in RunStore(home).all())


@pytest.mark.parametrize(
    "sweep, hosts, args, words",
    [
        ("{grid: {acc: [1, 2]}, max_parallel: 2}", "[localhost:2222, localhost]", (), "sweep.max_parallel"),
        ("{grid: {acc: [1, 2]}}", "[localhost:2222]", ("--max-parallel", "2"), "would share ports"),
        ("{grid: {nope: [1, 2]}}", "[localhost]", (), "sweep.grid.nope"),
        ("{zip: {acc: [1, 2], lr: [1]}}", "[localhost]", (), "need one length"),
        ("{random: {acc: {uniform: [0, 1]}}, samples: 1000000}", "[localhost]", (), "1,000,000 trials"),
        ("{grid: {acc: [1]}}", "[localhost]", ("--set", "nope=1"), "no parameter `nope`"),
    ],
)
def test_bad_input_is_refused_naming_the_key_before_anything_starts(
    tmp_path: Path, home: Path, sweep: str, hosts: str, args: tuple[str, ...], words: str
) -> None:
    cluster = write_cluster(tmp_path, sweep, hosts=hosts)
    refused = tfctl("-f", str(cluster), "sweep", *args, home=home)
    assert refused.returncode == 2, refused.stderr
    assert words in refused.stderr and "Traceback" not in refused.stderr
    assert RunStore(home).all() == [] and not (home / "sweeps").exists()


def test_a_trial_its_parameters_make_invalid_is_refused_with_its_key(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        """name: sw
command: "true"
params: {cores: 1}
jobs:
  worker: {hosts: [localhost], cpus: "{params.cores}"}
sweep: {grid: {cores: [1, -1]}}
"""
    )
    refused = tfctl("-f", str(cluster), "sweep", home=home)
    assert refused.returncode == 2 and "trial 1 (cores=-1)" in refused.stderr and "jobs.worker.cpus" in refused.stderr


def test_a_file_without_a_sweep_says_how_to_add_one(tmp_path: Path, home: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text('name: sw\ncommand: "true"\njobs: {worker: [localhost]}\n')
    refused = tfctl("-f", str(cluster), "sweep", home=home)
    assert refused.returncode == 2 and "has no `sweep:`" in refused.stderr and "grid" in refused.stderr
    status = tfctl("-f", str(cluster), "sweep", "status", home=home)
    assert status.returncode == 2 and "no sweep of" in status.stderr
