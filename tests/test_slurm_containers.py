"""`container:` on a real Slurm (`bench/slurm_lab.py`): each task's job step runs its monitor,
which runs the task in its container with the node's podman, as a host's supervisor does."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import pytest

from bench.containers_lab import IMAGE, HostPodmanLab, Lab, skip_reason
from bench.netns_hosts import require_netns
from bench.slurm_lab import SlurmLab, missing_binaries
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, no_warnings, tfctl
from tests.test_containers import boxed_tf
from tests.test_slurm import LAB_NAMES, run_processes
from tests.test_templates import check_common, copy_template
from tfctl.supervisor import containers

BOXED_FILE = """\
name: boxed
backend: slurm
slurm: {nodes: 1, time: "00:10:00", controller: login}  # the node has 2 cores: a task each
grace_period: 2
startup_timeout: 60
container:
  image: %(image)s
  runtime: podman
  mounts: ["%(tasks)s:%(tasks)s:ro"]
command: "{python} %(task)s --name {job_name}{task_index} --port -1 --lines 3 --sleep -1"
jobs:
  ps: {count: 1, port: 2222}
  worker: {count: 1, port: 2222}
"""


@pytest.fixture(scope="module")
def boxed_slurm(tmp_path_factory: pytest.TempPathFactory, rootfs: Path) -> Iterator[tuple[SlurmLab, Lab]]:
    """A one-node Slurm whose node has a podman of its own (its configuration reaches every job
    step through the environment srun passes on)."""
    require_netns()
    reason = skip_reason("podman")
    if reason is not None:
        pytest.skip(reason)
    missing = missing_binaries()
    if missing:
        if os.environ.get("TFCTL_REQUIRE_NETNS", "") not in ("", "0"):
            pytest.fail(f"Slurm is required here but missing: {', '.join(missing)}", pytrace=False)
        pytest.skip(f"Slurm is not installed (apt install slurm-wlm munge): missing {', '.join(missing)}")
    prefix, bridge, subnet = LAB_NAMES[__name__]
    base = tmp_path_factory.mktemp("slurm-boxed")
    with SlurmLab(base / "slurm", n=1, prefix=prefix, bridge=bridge, subnet=subnet) as slurm:
        podman = HostPodmanLab(base / "podman", slurm.hosts[0])
        try:
            podman.start(rootfs)
            yield slurm, podman
        finally:
            podman.tear_down()


def start_boxed(slurm: SlurmLab, podman: Lab, tmp_path: Path, home: Path) -> tuple[Path, str, dict[str, str]]:
    """`up -d` of the stand-in cluster in containers: its file, its run id, and the environment
    tfctl runs with (the lab's Slurm and the node's podman)."""
    env = {**slurm.env(), **podman.env}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(BOXED_FILE % {"image": IMAGE, "tasks": FAKE_TASK.parent, "task": FAKE_TASK})
    up = tfctl("-f", str(cluster), "up", "-d", home=home, env=env, timeout=120)
    assert up.returncode == 0, up.stderr
    assert f"in podman image {IMAGE}), no tensorflow in the image" in up.stderr  # preflight asked the image
    return cluster, up.stdout.strip(), env


@pytest.fixture
def remove_after(boxed_slurm: tuple[SlurmLab, Lab]) -> Iterator[list[str]]:
    """Runs whose containers a failing test may have left: removed by label whatever happened."""
    runs: list[str] = []
    yield runs
    for run_id in runs:
        for name in boxed_slurm[1].containers(f"{containers.RUN_LABEL}={run_id}"):
            boxed_slurm[1].cli("rm", "--force", name)


@pytest.mark.netns
def test_slurm_tasks_run_in_their_containers_and_down_leaves_nothing(
    boxed_slurm: tuple[SlurmLab, Lab], tmp_path: Path, home: Path, remove_after: list[str]
) -> None:
    slurm, podman = boxed_slurm
    cluster, run_id, env = start_boxed(slurm, podman, tmp_path, home)
    remove_after.append(run_id)
    label = f"{containers.RUN_LABEL}={run_id}"
    (job,) = slurm.jobs()
    tasks = ("ps:0", "worker:0")
    assert sorted(podman.containers(label)) == [containers.name_for(run_id, t) for t in tasks]
    for task in tasks:  # each container is the task's: labelled with it, running the image
        shown = json.loads(podman.cli("inspect", containers.name_for(run_id, task)))[0]
        assert shown["Config"]["Labels"][containers.TASK_LABEL] == task
        assert shown["ImageName"] == IMAGE and shown["State"]["Running"]
    assert len([s for s in slurm.steps() if s.startswith(f"{job}.") and s != f"{job}.batch"]) >= 2
    status = json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, env=env).stdout)
    assert {t["state"] for t in status["tasks"]} == {"running"}
    logs = tfctl("-f", str(cluster), "logs", "worker:0", home=home, env=env).stdout
    assert "worker0 line 2" in logs
    down = tfctl("-f", str(cluster), "down", home=home, env=env)
    assert down.returncode == 0, down.stderr
    assert "2 containers stopped" in down.stderr and "0 remain" in down.stderr
    assert podman.containers(label) == []
    assert slurm.jobs() == [] and slurm.steps() == []
    assert run_processes(slurm, run_id) == []


@pytest.mark.netns
def test_slurm_ending_the_job_leaves_no_container(
    boxed_slurm: tuple[SlurmLab, Lab], tmp_path: Path, home: Path, remove_after: list[str]
) -> None:
    """scancel kills the steps' processes, not the containers (conmon is nobody's child there):
    each container's tether ends its task once its monitor is gone, and `--rm` removes it."""
    slurm, podman = boxed_slurm
    cluster, run_id, env = start_boxed(slurm, podman, tmp_path, home)
    remove_after.append(run_id)
    label = f"{containers.RUN_LABEL}={run_id}"
    assert len(podman.containers(label)) == 2
    (job,) = slurm.jobs()
    slurm.run(["scancel", job])
    began = time.monotonic()
    wait_until(lambda: podman.containers(label) == [], 30, "no container of the run left", interval=0.2)
    gone = time.monotonic() - began
    run = wait_until(
        lambda: json.loads(tfctl("-f", str(cluster), "status", "--json", home=home, env=env).stdout)["run"],
        30,
        "the run's end",
        until=lambda run: run["state"] != "running",
        interval=0.5,
    )
    assert run["reason"] == f"Slurm ended job {job}: CANCELLED"
    assert slurm.jobs() == [] and slurm.steps() == []
    wait_until(lambda: run_processes(slurm, run_id) == [], 10, "no process of the run left", interval=0.2)
    print(f"containers gone {gone:.1f}s after scancel")


@pytest.mark.tf
@pytest.mark.netns
def test_the_all_reduce_template_trains_in_containers_on_slurm(
    boxed_slurm: tuple[SlurmLab, Lab], tmp_path: Path, home: Path, remove_after: list[str]
) -> None:
    """The multi-worker-mirrored template, its two workers as steps on the lab's node, each in
    its podman container with TensorFlow from the suite's venv, trains to its accuracy."""
    slurm, podman = boxed_slurm
    cluster = copy_template("multi-worker-mirrored", tmp_path, train_steps=200, extra=boxed_tf())
    text = cluster.read_text().replace("worker: [localhost, localhost]", "worker: {count: 2, port: 2222}")
    cluster.write_text(text + 'backend: slurm\nslurm: {nodes: 1, time: "00:10:00", controller: login}\n')
    env = {**slurm.env(), **podman.env}
    up = tfctl("-f", str(cluster), "up", home=home, env=env, timeout=300)
    run_id = json.loads(tfctl("runs", "--json", home=home).stdout)[-1]["run_id"]
    remove_after.append(run_id)
    assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
    assert "job succeeded" in up.stderr
    no_warnings(up.stderr)
    check_common(up, "worker:0", 200)
    assert f"in podman image {IMAGE}), tensorflow " in up.stderr  # preflight asked the image's Python
    assert podman.containers(f"{containers.RUN_LABEL}={run_id}") == []
    assert slurm.jobs() == [] and slurm.steps() == []
    assert run_processes(slurm, run_id) == []
