"""The queue and sweeps from Python, on localhost: `tfctl.submit` and `tfctl.queue` on a pool of
one stand-in GPU (a queued run's handle waits through the queue; `down()` takes a waiting one
out), and `tfctl.sweep`, whose handle pickles, lists its trials, waits and reads the results."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

import tfctl
from tests.conftest import FAKE_TASK
from tfctl.supervisor import claims


@pytest.fixture
def one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine as a pool host with one stand-in GPU; the pool file's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$1" in\n  --query-compute-apps=*|--query-gpu=index,utilization.gpu) ;;\n'
        '  *) echo "0, GPU-0" ;;\nesac\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(claims.CLAIMS_ENV, str(tmp_path / "claims"))
    (tmp_path / "pool.yaml").write_text("hosts:\n  localhost: {gpus: 1}\n")
    return tmp_path / "pool.yaml"


def test_submit_then_queue_then_wait_and_down_of_a_waiting_run(tmp_path: Path, home: Path, one_gpu: Path) -> None:
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --sleep {{params.sleep}}"
    path = tmp_path / "train.yaml"
    path.write_text(
        f"name: train\npool: {one_gpu}\ngrace_period: 2\nparams: {{sleep: 1}}\ncommand: {json.dumps(command)}\n"
        "jobs:\n  worker: {count: 1, gpus: 1}\n"
    )
    first = tfctl.submit(path, params={"sleep": 3})
    second, third = tfctl.submit(path), tfctl.submit(path, priority=-1)
    assert isinstance(first, tfctl.Run) and pickle.loads(pickle.dumps(first)) == first
    entries = {e.id: e for e in tfctl.queue()}
    assert set(entries) == {first.id, second.id, third.id}
    assert all(isinstance(e, tfctl.QueueEntry) and e.pool == str(one_gpu) for e in entries.values())
    assert entries[third.id].state is tfctl.RunState.QUEUED
    stopped = third.down()  # taken out while it waits: nothing of it ran anywhere
    assert stopped.clean and stopped.processes == 0
    assert first.wait(timeout=60).succeeded and second.wait(timeout=60).succeeded
    assert third.wait(timeout=5).state is tfctl.RunState.STOPPED
    assert tfctl.run(first.id).status().data["run"]["params"] == {"sleep": 3}
    with pytest.raises(tfctl.UsageError, match="names no pool"):
        plain = tmp_path / "plain.yaml"
        plain.write_text(f"name: plain\ncommand: {FAKE_TASK}\njobs:\n  worker: [localhost]\n")
        tfctl.submit(plain)


def test_a_sweep_from_python_waits_and_gives_its_results(tmp_path: Path, home: Path) -> None:
    command = f"{{python}} {FAKE_TASK} --port -1 --lines 1 --sleep 0.3 --exit {{params.code}}"
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"name: sw\ngrace_period: 2\ncommand: {json.dumps(command)}\nparams: {{code: 0, lr: 0.1}}\n"
        "jobs:\n  worker: [localhost]\nsweep: {grid: {lr: [0.1, 0.01, 0.001]}, max_parallel: 2}\n"
    )
    made = tfctl.sweep(path, params={"code": 0})
    assert isinstance(made, tfctl.Sweep) and pickle.loads(pickle.dumps(made)) == made
    assert [t["trial"] for t in made.trials] == [0, 1, 2]
    ended = made.wait(timeout=120)
    assert ended == {"sweep": made.id, "state": "done", "reason": "3 trials succeeded"}
    rows = made.results()
    assert sorted(r["params"]["lr"] for r in rows) == [0.001, 0.01, 0.1]
    assert {r["state"] for r in rows} == {"succeeded"} and all(r["run_id"] for r in rows)
    assert made.down() == []  # nothing left to stop
    again = tfctl.sweep(path, params={"code": 0})
    with pytest.raises(tfctl.Timeout):
        again.wait(timeout=0)
    assert again.wait(timeout=120)["state"] == "done"
