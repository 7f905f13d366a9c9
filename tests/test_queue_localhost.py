"""The queue through the real CLI, on this machine as a pool host with stand-in GPUs: runs start
by priority as GPUs free, the host's own holdings (sampled, not the queue's record) never exceed
what the pool offers, `cancel` takes a run out or stops it (also racing its start), and the
queue survives the SIGKILL of every tfctl process of the user: nothing lost, none started twice.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, tfctl
from tfctl.supervisor import claims


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """This machine as a pool host with 2 stand-in GPUs, and a claims folder of the test's own
    (the test reads the host's holdings from it, as `tfctl pool` does)."""
    bin_dir, folder = tmp_path / "bin", tmp_path / "claims"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        """#!/bin/sh
case "$1" in
  --query-compute-apps=*|--query-gpu=index,utilization.gpu) ;;
  *) printf '0, GPU-0\\n1, GPU-1\\n' ;;
esac
"""
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    (tmp_path / "pool.yaml").write_text("hosts:\n  localhost: {gpus: 2, tasks: 8}\n")
    monkeypatch.setenv(claims.CLAIMS_ENV, str(folder))
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", claims.CLAIMS_ENV: str(folder)}
    yield env
    home = tmp_path / "home"
    for record in runs(tmp_path, env):  # whatever a failed test left: stopped, by the CLI
        if record["state"] in ("queued", "starting", "running"):
            run(tmp_path, env, "cancel", record["run_id"])
    pid = queue(tmp_path, env)["driver"] if home.exists() else None
    if pid:
        wait_until(lambda: not _alive(pid), 30, "the queue's driver ending once nothing waits")


def cluster(tmp_path: Path, name: str, seconds: float, gpus: int = 1) -> Path:
    path = tmp_path / f"{name}.yaml"
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --sleep {seconds}"
    path.write_text(
        f"name: {name}\npool: ./pool.yaml\ngrace_period: 2\ncommand: {json.dumps(command)}\n"
        f"jobs:\n  worker: {{count: 1, gpus: {gpus}}}\n"
    )
    return path


def run(tmp_path: Path, lab: dict[str, str], *args: str) -> Any:
    return tfctl(*args, home=tmp_path / "home", env=lab, cwd=tmp_path)


def submit(tmp_path: Path, lab: dict[str, str], file: Path, *more: str) -> str:
    done = run(tmp_path, lab, "-f", str(file), "submit", "--json", *more)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["state"] == "queued"
    return str(said["run_id"])


def queue(tmp_path: Path, lab: dict[str, str]) -> dict[str, Any]:
    shown = run(tmp_path, lab, "queue", "--json")
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


def runs(tmp_path: Path, lab: dict[str, str]) -> list[dict[str, Any]]:
    shown = run(tmp_path, lab, "runs", "--json")
    assert shown.returncode == 0, shown.stderr
    return list(json.loads(shown.stdout))


class Sampler:
    """The host's holdings every 50 ms, as its kernel's lock table says (never the queue's own
    record): the most GPUs ever held at once, and the order in which runs first held one."""

    def __init__(self) -> None:
        self.most = 0
        self.order: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _sample(self) -> None:
        while not self.stop.wait(0.05):
            gpus = [h for h in claims.holdings() if h.resource.startswith("gpu-")]
            self.most = max(self.most, len(gpus))
            self.order += [h.run_id for h in gpus if h.run_id and h.run_id not in self.order]  # ("": note not yet)


def ended(tmp_path: Path, lab: dict[str, str], ids: list[str], seconds: float = 90) -> dict[str, dict[str, Any]]:
    def states() -> dict[str, dict[str, Any]]:
        return {r["run_id"]: r for r in runs(tmp_path, lab) if r["run_id"] in ids}

    return wait_until(
        states, seconds, "every run ending", until=lambda s: all(r["state"] not in LIVE for r in s.values())
    )


LIVE = ("queued", "starting", "running")


def test_queued_runs_start_by_priority_as_gpus_free_never_more_than_the_pool_has(
    tmp_path: Path, lab: dict[str, str]
) -> None:
    (tmp_path / "one.yaml").write_text("hosts:\n  localhost: {gpus: 1}\n")
    gate = tmp_path / "gate"  # every run holds its GPU until the gate opens, then ends 1 s later
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --sleep 1 && while [ ! -e {gate} ]; do sleep 0.1; done"
    file = tmp_path / "train.yaml"
    file.write_text(
        f"name: train\npool: ./one.yaml\ngrace_period: 2\ncommand: {json.dumps(command)}\n"
        "jobs:\n  worker: {count: 1, gpus: 1}\n"
    )
    with Sampler() as seen:
        first = [submit(tmp_path, lab, file) for _ in range(3)]
        urgent = submit(tmp_path, lab, file, "--priority", "5")
        assert {r["state"] for r in runs(tmp_path, lab) if r["run_id"] == urgent} == {"queued"}  # 1 GPU, 4 runs
        waiting = wait_until(
            lambda: [r for r in queue(tmp_path, lab)["runs"] if r["state"] == "queued"],
            30,
            "the driver's look at the waiting runs",
            until=lambda w: w and all(r["why"] for r in w),
        )
        assert [r["run_id"] for r in waiting] == [urgent, *first[1:]]  # in the order they will start
        assert [r["position"] for r in waiting] == [1, 2, 3]
        assert all("needs 1 GPU on one host; the most free on any host is 0" in r["why"] for r in waiting), waiting
        gate.touch()
        states = ended(tmp_path, lab, [*first, urgent])
    assert {r["state"] for r in states.values()} == {"succeeded"}, states
    assert seen.most == 1  # never more GPUs held than the pool offers
    assert seen.order == [first[0], urgent, *first[1:]]  # priority first, then submission order
    assert claims.holdings() == []


def test_cancel_takes_a_queued_run_out_and_stops_a_running_one(tmp_path: Path, lab: dict[str, str]) -> None:
    big = cluster(tmp_path, "big", seconds=60, gpus=2)
    running = submit(tmp_path, lab, big)
    wait_until(lambda: claims.holdings(), 30, "the first run holding its GPUs")
    behind = submit(tmp_path, lab, big)
    shown = wait_until(
        lambda: run(tmp_path, lab, "status", "--run", behind).stdout, 10, "its place", until=lambda s: "place" in s
    )
    assert f"run {behind} is queued (place 1 in the queue): worker:0 needs 2 GPUs on one host" in shown, shown
    logs = run(tmp_path, lab, "logs", "--run", behind)
    assert logs.returncode == 2 and f"run {behind} is queued: it has no tasks yet" in logs.stderr
    cancelled = run(tmp_path, lab, "cancel", behind, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["runs"] == [
        {"run_id": behind, "result": "cancelled", "state": "stopped", "clean": True}
    ]
    stopped = run(tmp_path, lab, "cancel", "--run", running)
    assert stopped.returncode == 0, stopped.stderr
    assert f"run {running}: stopped\n1 process stopped on 1 host; 0 remain" in stopped.stderr, stopped.stderr
    states = {r["run_id"]: r for r in runs(tmp_path, lab)}
    assert states[behind]["state"] == "stopped" and states[running]["state"] == "stopped"
    assert claims.holdings() == []
    again = run(tmp_path, lab, "cancel", behind)
    assert again.returncode == 0 and "ended already" in again.stderr


def test_cancel_racing_the_start_leaves_each_run_cancelled_or_stopped_and_nothing_held(
    tmp_path: Path, lab: dict[str, str]
) -> None:
    file = cluster(tmp_path, "race", seconds=30)
    ids = []
    for _ in range(4):
        ids.append(submit(tmp_path, lab, file))
        done = run(tmp_path, lab, "cancel", ids[-1], "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["runs"][0]["result"] in ("cancelled", "stopped")
    states = ended(tmp_path, lab, ids)
    assert {r["state"] for r in states.values()} == {"stopped"}
    assert claims.holdings() == []


def test_a_run_that_can_never_fit_or_names_no_pool_is_refused_at_submit(tmp_path: Path, lab: dict[str, str]) -> None:
    refused = run(tmp_path, lab, "-f", str(cluster(tmp_path, "huge", seconds=1, gpus=3)), "submit")
    assert refused.returncode == 2
    assert "can never fit on pool pool: worker:0 needs 3 GPUs on one host" in refused.stderr, refused.stderr
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"name: plain\ncommand: {FAKE_TASK}\njobs:\n  worker: [localhost]\n")
    refused = run(tmp_path, lab, "-f", str(plain), "submit")
    assert refused.returncode == 2 and "names no pool" in refused.stderr
    assert runs(tmp_path, lab) == []  # nothing recorded


def test_every_tfctl_process_sigkilled_loses_no_queued_run_and_starts_none_twice(
    tmp_path: Path, lab: dict[str, str]
) -> None:
    file = cluster(tmp_path, "kill", seconds=3, gpus=2)
    ids = [submit(tmp_path, lab, file) for _ in range(3)]
    with Sampler() as seen:
        wait_until(lambda: claims.holdings(), 30, "the first run holding its GPUs")
        home = tmp_path / "home"
        driver = queue(tmp_path, lab)["driver"]
        watchers = [json.loads((home / "runs" / i / "run.json").read_text()).get("watcher") for i in ids]
        pids = [driver, *(w["pid"] for w in watchers if w)]
        for pid in pids:  # every tfctl process of the user: the driver and every watcher
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(_alive(p) for p in pids), 10, "the killed processes gone")
        shown = run(tmp_path, lab, "queue")  # the next command brings the queue back
        assert "started the queue's driver again" in shown.stderr, shown.stderr
        states = ended(tmp_path, lab, ids)
    assert len(states) == 3  # none lost
    assert seen.most <= 2
    starts = (home / "queue" / "driver.log").read_text().count
    assert all(starts(f"run {i}: started") == 1 for i in ids)  # none started twice
    assert claims.holdings() == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of this test's is gone for the purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sweep_on_a_pool_goes_through_the_queue_its_trials_each_once(tmp_path: Path, lab: dict[str, str]) -> None:
    path = tmp_path / "sweep.yaml"
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --sleep 1 --exit {{params.code}}"
    path.write_text(
        f"name: sw\npool: ./pool.yaml\ngrace_period: 2\ncommand: {json.dumps(command)}\n"
        "params: {code: 0, lr: 0.1}\njobs:\n  worker: {count: 1, gpus: 1}\n"
        "sweep: {grid: {lr: [0.1, 0.01], code: [0, 3]}, max_parallel: 3}\n"
    )
    with Sampler() as seen:
        done = run(tmp_path, lab, "-f", str(path), "sweep")
    assert done.returncode == 1, done.stderr  # two trials fail by their parameters
    shown = run(tmp_path, lab, "-f", str(path), "sweep", "status", "--json")
    trials = json.loads(shown.stdout)["trials"]
    assert sorted(t["state"] for t in trials) == ["failed", "failed", "succeeded", "succeeded"], trials
    records = [r for r in runs(tmp_path, lab)]
    assert len(records) == 4  # each trial once
    assert all(r["params"]["code"] == 3 for r in records if r["state"] == "failed")
    stored = [json.loads((tmp_path / "home" / "runs" / r["run_id"] / "run.json").read_text()) for r in records]
    assert all(s["pool"] and s["sweep"] and s["placement"] for s in stored)  # queued, trial kept, placed
    assert seen.most <= 2
    assert claims.holdings() == []


def test_cancel_of_a_sweep_takes_its_waiting_trials_out_and_stops_the_running(
    tmp_path: Path, lab: dict[str, str]
) -> None:
    path = tmp_path / "long.yaml"
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --sleep 60"
    path.write_text(
        f"name: long\npool: ./pool.yaml\ngrace_period: 2\ncommand: {json.dumps(command)}\nparams: {{lr: 0.1}}\n"
        "jobs:\n  worker: {count: 1, gpus: 2}\nsweep: {grid: {lr: [0.1, 0.01, 0.001]}, max_parallel: 3}\n"
    )
    made = run(tmp_path, lab, "-f", str(path), "sweep", "-d")
    assert made.returncode == 0, made.stderr
    sweep_id = made.stdout.strip()
    wait_until(lambda: claims.holdings(), 30, "one trial holding both GPUs")
    wait_until(lambda: len(runs(tmp_path, lab)), 30, "every trial submitted", until=lambda n: n == 3)
    done = run(tmp_path, lab, "cancel", "--sweep", sweep_id)
    assert done.returncode == 0, done.stderr
    assert f"sweep {sweep_id}: stopped" in done.stderr
    reasons = sorted(r["reason"] for r in runs(tmp_path, lab))
    assert reasons == ["cancelled while queued", "cancelled while queued", "tfctl down"], reasons
    assert claims.holdings() == []
