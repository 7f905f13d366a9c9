"""GPUs and cores per task: placement without hosts, what each task's environment gets, and what a
host's supervisor reports (with a stand-in nvidia-smi)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tfctl.config.devices import DeviceAsk, DeviceError, HostDevices, Placement, enough_for, gpu_hosts, place
from tfctl.config.loader import parse_config
from tfctl.controller.start.plan import draft, make_plan
from tfctl.errors import EXIT_USAGE
from tfctl.supervisor import checks, devices
from tfctl.supervisor.protocol import Gpu, InfoRequest
from tfctl.tf import tasks as tfc

FOUR_GPUS = HostDevices(gpus=(0, 1, 2, 3), cpus=(0, 1, 2, 3, 4, 5, 6, 7))


def asks(*specs: tuple[str, str, int | None, int | None]) -> list[DeviceAsk]:
    return [DeviceAsk(task, host, gpus, cpus) for task, host, gpus, cpus in specs]


def test_tasks_on_a_host_get_disjoint_gpus_and_cores_in_order() -> None:
    placed = place(
        asks(("ps:0", "a", None, 1), ("worker:0", "a", 2, 3), ("worker:1", "a", 2, 3), ("worker:2", "b", 1, None)),
        {"a": FOUR_GPUS, "b": HostDevices(gpus=(0, 1), cpus=(4, 5))},
    )
    assert placed == {
        "ps:0": Placement(gpus=(), cpus=(0,)),  # beside tasks with GPUs: it sees none
        "worker:0": Placement(gpus=(0, 1), cpus=(1, 2, 3)),
        "worker:1": Placement(gpus=(2, 3), cpus=(4, 5, 6)),
        "worker:2": Placement(gpus=(0,), cpus=None),  # indices count per host
    }


def test_cores_are_the_ones_the_host_allows() -> None:
    placed = place(asks(("worker:0", "a", None, 2), ("worker:1", "a", None, 1)), {"a": HostDevices(cpus=(2, 3, 7))})
    assert [placed[t].cpus for t in ("worker:0", "worker:1")] == [(2, 3), (7,)]


def test_gpus_zero_hides_every_gpu_and_no_gpus_anywhere_sets_nothing() -> None:
    placed = place(asks(("ps:0", "a", 0, None), ("worker:0", "a", None, None), ("worker:1", "b", None, None)), {})
    assert placed["ps:0"] == Placement(gpus=())
    # No task on the host got a GPU, so a task without `gpus` keeps whatever its host gives it.
    assert placed["worker:0"] == placed["worker:1"] == Placement()


def test_nvidia_smi_is_asked_only_where_a_task_wants_a_gpu() -> None:
    assert gpu_hosts(asks(("ps:0", "a", 0, 2), ("worker:0", "b", 1, None), ("worker:1", "c", None, None))) == {"b"}


def test_asking_for_more_than_a_host_has_names_host_have_ask_tasks_and_fix() -> None:
    with pytest.raises(DeviceError) as caught:
        place(
            asks(("worker:0", "a", 2, 4), ("worker:1", "a", 2, 4), ("worker:2", "a", 2, 1), ("ps:0", "b", None, 1)),
            {"a": FOUR_GPUS, "b": HostDevices(cpus=(0,))},
        )
    error = caught.value
    assert error.exit_code == EXIT_USAGE
    assert error.message.splitlines() == [
        "a has 4 GPUs; its tasks ask for 6: worker:0 2, worker:1 2, worker:2 2",
        "a has 8 CPU cores; its tasks ask for 9: worker:0 4, worker:1 4, worker:2 1",
    ]
    assert error.hint == (
        "lower `gpus` of job worker, or move some of those tasks to another host; "
        "lower `cpus` of job worker, or move some of those tasks to another host"
    )


def test_a_host_without_nvidia_smi_has_no_gpu_and_says_why() -> None:
    with pytest.raises(DeviceError) as caught:
        place(asks(("worker:0", "gpu1", 1, None)), {"gpu1": HostDevices(cpus=(0,), gpu_error="nvidia-smi not found")})
    assert caught.value.message == "gpu1 has 0 GPUs (nvidia-smi not found); its tasks ask for 1: worker:0 1"
    assert caught.value.hint is not None and "install the NVIDIA driver on gpu1" in caught.value.hint


def test_a_dry_run_places_on_hosts_with_just_enough() -> None:
    wanted = asks(("ps:0", "a", None, None), ("worker:0", "a", 2, 1), ("worker:1", "b", 1, 2))
    hosts = enough_for(wanted)
    assert hosts == {"a": HostDevices((0, 1), (0,)), "b": HostDevices((0,), (0, 1))}
    assert place(wanted, hosts)["ps:0"] == Placement(gpus=())


CLUSTER = """\
name: g
command: train
env: {SHARD: "{job_name}-{task_index}", DEVICES: "gpu {gpus}", LITERAL: "${{HOME}} {{x}}", PLAIN: a$b}
jobs:
  ps: [localhost:2222]
  worker:
    hosts: [localhost:2223, localhost:2224]
    gpus: 2
    cpus: 1
"""


def test_each_task_gets_cuda_visible_devices_and_its_env_placeholders(tmp_path: Path) -> None:
    config = parse_config(CLUSTER, tmp_path / "cluster.yaml")
    devices = {"localhost": HostDevices((0, 1, 2, 3), (0, 1))}
    ps, w0, w1 = tfc.plan_tasks(config, "g-1", {"localhost": "py"}, {"localhost": "/w"}, devices)
    assert [(t.gpus, t.cpus) for t in (ps, w0, w1)] == [((), None), ((0, 1), (0,)), ((2, 3), (1,))]
    assert [t.env["CUDA_VISIBLE_DEVICES"] for t in (ps, w0, w1)] == ["", "0,1", "2,3"]
    assert w1.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # the indices are nvidia-smi's
    assert (w1.env["SHARD"], w1.env["DEVICES"], ps.env["DEVICES"]) == ("worker-1", "gpu 2,3", "gpu ")
    assert (w1.env["LITERAL"], w1.env["PLAIN"]) == ("${HOME} {x}", "a$b")  # as written, no shell quoting


def test_without_gpus_nothing_is_set(tmp_path: Path) -> None:
    config = parse_config("name: g\ncommand: train\njobs: {worker: [localhost:1]}\n", tmp_path / "cluster.yaml")
    (task,) = tfc.plan_tasks(config, "g-1", {"localhost": "py"}, {"localhost": "/w"})
    assert "CUDA_VISIBLE_DEVICES" not in task.env and (task.gpus, task.cpus) == (None, None)


def test_a_run_is_planned_once_on_the_devices_its_hosts_have(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFCTL_HOME", str(tmp_path / "home"))
    run = draft(parse_config(CLUSTER, tmp_path / "cluster.yaml"), "g-1")
    assert run.record.tasks == ()  # drafted: hosts and settings, no task yet
    placed = make_plan(run, {"localhost": HostDevices((4, 5, 6, 7), (2, 3))})
    assert [t.gpus for t in placed.record.tasks] == [(), (4, 5), (6, 7)]
    assert [t.gpus for phase in placed.phases for t in phase.tasks] == [(), (4, 5), (6, 7)]
    assert [t.gpus for t in make_plan(run).record.tasks] == [(), (0, 1), (2, 3)]  # on what they ask for
    with pytest.raises(DeviceError):
        make_plan(run, {"localhost": HostDevices((0,), (0, 1))})


def test_setup_gets_the_env_a_host_can_have(tmp_path: Path) -> None:
    config = parse_config(CLUSTER + 'setup: ["pip install x"]\n', tmp_path / "cluster.yaml")
    env = tfc.setup_env(config, "g-1")
    assert env["LITERAL"] == "${HOME} {x}" and "SHARD" not in env and "DEVICES" not in env


# --- what a host's supervisor reports -----------------------------------------------------------


def stand_in_nvidia_smi(directory: Path, output: str, code: int = 0) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {code}\n")
    script.chmod(0o755)


def test_the_host_reports_the_gpus_nvidia_smi_lists(tmp_path: Path, monkeypatch) -> None:
    stand_in_nvidia_smi(tmp_path, "0, GPU-aa\\n1, GPU-bb\\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    root = str(tmp_path / "root")  # info() keeps the host's filesystem token there
    answer = checks.info(root, InfoRequest(gpus=True))
    assert (answer.gpus, answer.gpu_error) == ([Gpu(0, "GPU-aa"), Gpu(1, "GPU-bb")], None)
    assert answer.cpus == sorted(os.sched_getaffinity(0))
    assert checks.info(root, InfoRequest()).gpus == []  # not asked: nvidia-smi is not run


def test_a_failing_or_missing_nvidia_smi_means_no_gpu(tmp_path: Path, monkeypatch) -> None:
    stand_in_nvidia_smi(tmp_path, "NVIDIA-SMI has failed because it could not communicate with the driver\\n", 9)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert devices.gpus() == (
        [],
        "nvidia-smi exited with code 9: NVIDIA-SMI has failed because it could not communicate with the driver",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert devices.gpus() == ([], "nvidia-smi not found on PATH")


def test_nvidia_smi_lines_that_are_not_gpus_are_refused() -> None:
    assert devices.parse_gpus(["0, GPU-a", "", "12, GPU-b"]) == [Gpu(0, "GPU-a"), Gpu(12, "GPU-b")]
    with pytest.raises(ValueError):
        devices.parse_gpus(["No devices were found"])
