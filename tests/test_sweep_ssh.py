"""A sweep of the examples' MNIST program on the simulated SSH hosts, with real TensorFlow: a 3 x 2
grid zipped with 2 seeds (12 trials), 3 at a time on the same 3 hosts (each trial's ps and
workers on ports of their own), one trial failing by its parameters. Every tfctl process of the
sweep is SIGKILLed mid-sweep; `sweep --resume` then ends it with every trial run once, a table
of 11 accuracies and the failure's cause, and nothing of any trial left on any host."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import REPO, tfctl
from tests.test_ssh_cluster import run_pids, write_cluster
from tests.test_sweep_localhost import most_at_once, sweep_status, trial_runs
from tfctl.runs.store import RunStore
from tfctl.supervisor.procfs import is_same_process

pytestmark = [
    pytest.mark.netns,
    pytest.mark.tf,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
]

# The trial with lr 0.2, batch 100 and seed 2 refuses to train (exit 3); every other one trains.
COMMAND = (
    "test {params.lr}/{params.batch}/{params.seed} != 0.2/100/2 || {{ echo refusing this trial; exit 3; }}; "
    "exec {python} train.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
    "--worker_hosts={worker_hosts} --train_steps 600 --learning_rate {params.lr} --batch_size {params.batch}"
)
JOBS = "  ps: [tfh0]\n  worker: [tfh1, tfh2]"  # no ports: each trial's tasks get free ones
SWEEP = """params: {lr: 0.1, batch: 100, seed: 0}
sweep: {grid: {lr: [0.05, 0.1, 0.2], batch: [50, 100]}, zip: {seed: [1, 2]}, max_parallel: 3}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHostLab]:
    require_netns()
    with TestHostLab(
        3, workdir=tmp_path_factory.mktemp("sweep-lab"), prefix="tfctl-sw", bridge="tfctlbr84", subnet="10.77.84"
    ) as running:
        yield running


def test_twelve_mnist_trials_survive_a_sigkill_of_every_tfctl_process(
    tmp_path: Path, home: Path, lab: TestHostLab
) -> None:
    cluster = write_cluster(tmp_path, lab, JOBS, COMMAND, extra=SWEEP, workdir=REPO / "examples" / "mnist", name="sw")
    cluster.write_text(cluster.read_text().replace("grace_period: 2", "grace_period: 5"))
    started = tfctl("-f", str(cluster), "sweep", "-d", home=home, timeout=120)
    assert started.returncode == 0, started.stderr
    sweep_id = started.stdout.strip()
    wait_until(
        lambda: [t["state"] for t in sweep_status(cluster, home)["trials"]],
        240,
        "a trial ended and three running",
        until=lambda states: (
            len([s for s in states if s in ("succeeded", "failed")]) >= 1 and states.count("running") == 3
        ),
        interval=0.5,
    )
    driver = json.loads((home / "sweeps" / sweep_id / "sweep.json").read_text())["driver"]
    watchers = wait_until(
        lambda: [r.watcher for r in RunStore(home).all() if r.active and r.watcher is not None],
        30,
        "the running trials' watchers recorded",
        until=lambda found: len(found) == 3,
        interval=0.1,
    )
    victims = [driver, *[{"pid": w.pid, "starttime": w.starttime} for w in watchers]]
    for victim in victims:
        os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: not any(is_same_process(v) for v in victims), 10, "every tfctl process of the sweep gone")

    resumed = tfctl("-f", str(cluster), "sweep", "--resume", home=home, timeout=600)
    assert resumed.returncode == 1, resumed.stderr  # the one trial its parameters fail
    table = sweep_status(cluster, home, "--sort", "accuracy")
    trials = table["trials"]
    failed = [t for t in trials if t["state"] == "failed"]
    assert [t["params"] for t in failed] == [{"lr": 0.2, "batch": 100, "seed": 2}]
    assert "exit" in failed[0]["why"] and "3" in failed[0]["why"], failed[0]
    ok = [t for t in trials if t["state"] == "succeeded"]
    assert len(ok) == 11 and all(0.0 < t["metrics"]["accuracy"]["value"] <= 1.0 for t in ok), ok
    assert table["best"] == trials[0]["trial"]

    runs = trial_runs(home)
    assert sorted(runs) == list(range(12))
    for index, attempts in runs.items():  # each trial ran to its end once: the kill started none twice
        assert len([r for r in attempts if not r.cut_off]) == 1, (index, attempts)
    every = [r for attempts in runs.values() for r in attempts]
    assert most_at_once([r for r in every if not r.cut_off]) <= 3
    assert all(run_pids(lab, r.run_id) == {} for r in every)  # nothing of any trial on any host
