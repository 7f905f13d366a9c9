"""Spare hosts on the simulated SSH hosts: a worker's host freezes (every process SIGSTOPped),
and after host_timeout its task starts on the spare and the job finishes there.

The decisions (when a silent host is lost, what moves, what restarts with it, a failure held
while a peer's host is silent) are tables in tests/test_engine.py and tests/test_spares.py; here
real TensorFlow templates prove the end to end: the move, the resume, nothing left behind."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from bench.netns_hosts import TestHostLab, require_netns
from bench.waiting import wait_until
from tests.conftest import tfctl
from tests.test_ssh_cluster import run_pids, write_cluster
from tests.test_templates import copy_template

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
    with TestHostLab(
        4, workdir=tmp_path_factory.mktemp("spares-lab"), prefix="tfctl-sq", bridge="tfctlbr53", subnet="10.77.53"
    ) as lab:
        yield lab


def test_a_detached_runs_lost_host_that_comes_back_stops_its_old_task_and_down_leaves_nothing(
    tmp_path: Path, home: Path, lab
) -> None:
    """A detached run holds no lease: a host thawed after its task moved would train on beside
    the moved task for ever. The watcher stops it there once the host answers."""
    command = "{python} fake_task.py --name {job_name}{task_index} --port 2222 --sleep -1"
    extra = f"host_timeout: {HOST_TIMEOUT}\nspares: [tfh3]"
    cluster = write_cluster(tmp_path, lab, JOBS, command, extra=extra)
    up = tfctl("-f", str(cluster), "up", "-d", home=home, timeout=120)
    assert up.returncode == 0, up.stderr
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    frozen = lab.host("tfh2")
    try:
        try:
            frozen.signal_all(signal.SIGSTOP)
            wait_until(lambda: "tfh3" in run_pids(lab, run_id), 60, "worker:1 running on the spare", interval=0.1)
            stranded = run_pids(lab, run_id)["tfh2"]
            shown = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, timeout=60).stdout)
            assert shown["run"]["lost_hosts"] == ["tfh2"], shown["run"]
        finally:
            frozen.signal_all(signal.SIGCONT)
        wait_until(lambda: "tfh2" not in run_pids(lab, run_id), 30, "tfh2's old worker:1 stopped", interval=0.1)
        assert stranded  # (a stopped task leaves the run's processes before its parent reaps it)
        wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in stranded), 10, "its pids gone")
        # Its answer is weighed at the watcher's next look: then it is struck off the record.
        run = wait_until(
            lambda: json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, timeout=60).stdout)["run"],
            10,
            "tfh2 struck off the run's lost hosts",
            until=lambda run: run["lost_hosts"] == [],
        )
        assert run["state"] == "running", run
    finally:
        down = tfctl("-f", str(cluster), "down", home=home, timeout=120)
    assert down.returncode == 0, down.stderr
    assert run_pids(lab, run_id) == {}


def run_template_and_freeze(
    tmp_path: Path,
    home: Path,
    lab,
    template_name: str,
    steps: int,
    jobs: str,
    extra: str,
    frozen_host: str,
    spare: str,
    training: tuple[Callable[[str], object], str, float],
    name: str,
    grace: int | None = None,
) -> tuple[str, str, float]:
    """The template attached (`up`'s output to a file), `frozen_host` frozen once `training`
    (check of the output, what it waits for, how long) holds, until its task runs on `spare` and
    `up` exits 0: (the output, the run id, seconds from the freeze to the spare)."""
    template = copy_template(template_name, tmp_path, train_steps=steps)
    command = re.search(r"command: >-\n((?:  .*\n)+)", template.read_text())
    assert command is not None
    line = " ".join(command.group(1).split())
    if "{logdir}" in line:  # the template's summaries, as its own file has them
        extra += "\nlogdir: logs/{run_id}"
    cluster = write_cluster(tmp_path, lab, jobs, line, extra=extra, workdir=template.parent, name=name)
    if grace is not None:  # the template's own
        cluster.write_text(cluster.read_text().replace("grace_period: 2", f"grace_period: {grace}"))
    out = tmp_path / "up.out"
    with out.open("w") as stdout:
        up = subprocess.Popen(
            [sys.executable, "-m", "tfctl", "-f", str(cluster), "up"],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TFCTL_HOME": str(home)},
        )
    frozen = lab.host(frozen_host)
    check, what, within = training
    try:
        wait_until(lambda: check(out.read_text()), within, what, interval=0.1)
        run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
        frozen.signal_all(signal.SIGSTOP)
        froze = time.monotonic()
        wait_until(lambda: spare in run_pids(lab, run_id), 60, f"the moved task on {spare}", interval=0.1)
        moved_after = time.monotonic() - froze
        assert up.wait(timeout=600) == 0, out.read_text()[-5000:]
    finally:
        frozen.signal_all(signal.SIGCONT)
        if up.poll() is None:
            up.kill()
            up.wait()
    return out.read_text(), run_id, moved_after


FINAL = re.compile(r"^\[worker:0\]\s+final step (\d+) loss \S+ accuracy ([\d.]+)", re.M)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_the_between_graph_template_finishes_with_its_lost_worker_moved_to_the_spare(
    tmp_path: Path, home: Path, lab
) -> None:
    """Real TensorFlow: worker 1's host freezes mid-training; worker 1 starts on the spare, the ps
    and the chief start again with its new address (the chief from its checkpoint), worker 1
    trains there, and the chief finishes with the template's accuracy."""
    steps = 8000
    jobs = "  ps: [tfh0:2222]\n  worker: [tfh1:2222, tfh2:2222]"
    extra = f"lease_timeout: 6\nhost_timeout: {HOST_TIMEOUT}\nspares: [tfh3]\nsuccess_policy: chief"
    training = (lambda out: "worker 1 accuracy" in out, "worker 1 training", 180.0)
    text, run_id, moved_after = run_template_and_freeze(
        tmp_path, home, lab, "between-graph-async", steps, jobs, extra, "tfh2", "tfh3", training, "bga"
    )
    cluster = tmp_path / "cluster.yaml"
    assert "moving worker:1 to spare tfh3" in text
    # Every task's whole output, the earlier lives' included, as `logs` reads it.
    logs = tfctl("-f", str(cluster), "logs", "--run", run_id, "worker:0", "worker:1", home=home, timeout=60).stdout
    final = FINAL.search(logs)
    assert final is not None, logs[-5000:]
    assert steps <= int(final.group(1)) <= steps + 4 and float(final.group(2)) >= 0.8, final.group(0)
    assert re.search(r"\[worker:0\]\s+resumed from \S+ at global step [1-9]", logs), logs[-5000:]
    assert re.search(r"\[worker:1\]\s+step \d+ loss \S+ steps/s \S+ worker 1 accuracy", logs), logs[-5000:]
    wait_until(lambda: run_pids(lab, run_id) == {}, 30, "the thawed host stopping its task", interval=0.2)
    print(f"worker:1 on the spare {moved_after:.1f}s after the freeze; final {final.group(0)}")


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    """3 hosts sharing one home, as with NFS: two MWMS workers and a spare."""
    require_netns()
    workdir = tmp_path_factory.mktemp("spares-shared")
    with TestHostLab(
        3, workdir=workdir, prefix="tfctl-sp", bridge="tfctlbr33", subnet="10.77.33", shared_home=True
    ) as lab:
        yield lab


MWMS_STEPS = 3000
RESUMED = re.compile(r"^\[worker:0\]\s+resumed from \S+ at step (\d+)$", re.M)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_the_all_reduce_template_moves_a_frozen_worker_and_resumes_from_its_periodic_checkpoint(
    tmp_path: Path, home: Path, shared_lab
) -> None:
    """Real TensorFlow, MultiWorkerMirrored on a shared home: worker 1's host freezes; worker 1
    starts on the spare and worker 0 with it (one collective group), both from the last
    periodic checkpoint (the save on SIGTERM needs the frozen worker), and the job finishes.
    Worker 0 often fails on UNAVAILABLE from its frozen peer before the host is judged lost: the
    run waits for that verdict and starts it again with the move."""
    extra = f"lease_timeout: 6\nhost_timeout: {HOST_TIMEOUT}\nspares: [tfh2]"
    jobs = "  worker: [tfh0:2222, tfh1:2222]"
    training = (lambda out: re.search(r"\[worker:0\]\s+step [2-9]00 ", out), "step 200", 240.0)
    text, run_id, moved_after = run_template_and_freeze(
        tmp_path,
        home,
        shared_lab,
        "multi-worker-mirrored",
        MWMS_STEPS,
        jobs,
        extra,
        "tfh1",
        "tfh2",
        training,
        "mwms",
        5,
    )
    assert "moving worker:1 to spare tfh2" in text, text[-5000:]
    assert re.search(r"restarting worker:0|worker:0 ended while tfh1 was silent: starting again", text), text[-5000:]
    resumed, final = RESUMED.findall(text), FINAL.search(text)  # streamed by the attached up
    assert len(resumed) == 1 and 200 <= int(resumed[0]) < MWMS_STEPS and int(resumed[0]) % 100 == 0, text[-5000:]
    assert final is not None and int(final.group(1)) == MWMS_STEPS and float(final.group(2)) >= 0.8, text[-5000:]
    wait_until(lambda: run_pids(shared_lab, run_id) == {}, 30, "every task of the run gone", interval=0.2)
    first = "failed first, so the run waited" if "worker:0 ended while tfh1" in text else "restarted for the move"
    print(f"worker:1 on the spare {moved_after:.1f}s after the freeze; worker:0 {first}; resumed at step {resumed[0]}")
    print(final.group(0))


PS_STEPS = 3000
PS_RESUMED = re.compile(r"^\[chief:0\]\s+resumed from \S+ at global step (\d+)$", re.M)
PS_FINAL = re.compile(r"^\[chief:0\]\s+final step (\d+) loss \S+ accuracy ([\d.]+)", re.M)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_the_parameter_server_template_moves_a_frozen_worker_and_the_chief_resumes(
    tmp_path: Path, home: Path, lab
) -> None:
    """Real TensorFlow, TF2 ParameterServerStrategy on hosts of their own: worker 1's host
    freezes; it starts on the spare, and the ps, the chief (the coordinator) and worker 0 start
    again with its address, the chief from its checkpoint on its own host."""
    extra = f"lease_timeout: 6\nhost_timeout: {HOST_TIMEOUT}\nspares: [tfh3]\nsuccess_policy: chief"
    jobs = "  ps: [tfh0:2222]\n  chief: [tfh0:2223]\n  worker: [tfh1:2222, tfh2:2222]"
    training = (lambda out: re.search(r"\[chief:0\]\s+step [4-9]\d\d ", out), "step 400", 240.0)
    text, run_id, _ = run_template_and_freeze(
        tmp_path, home, lab, "parameter-server", PS_STEPS, jobs, extra, "tfh2", "tfh3", training, "pss", 10
    )
    assert "moving worker:1 to spare tfh3" in text, text[-5000:]
    resumed, final = PS_RESUMED.findall(text), PS_FINAL.search(text)
    assert len(resumed) == 1 and 400 <= int(resumed[0]) < PS_STEPS, text[-5000:]
    assert final is not None and int(final.group(1)) >= PS_STEPS and float(final.group(2)) >= 0.8, text[-5000:]
    wait_until(lambda: run_pids(lab, run_id) == {}, 30, "every task of the run gone", interval=0.2)
    print(f"chief resumed at global step {resumed[0]}; {final.group(0)}")
