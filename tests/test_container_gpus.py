"""A task's GPUs in its container, on real runtimes with stand-in GPUs (there is no GPU here): a
stand-in nvidia-smi for tfctl to place tasks on, and for podman a CDI spec whose `nvidia.com/gpu=K`
puts a device node /dev/nvidiaK in the container (`bench/stand_in_gpus.py`). docker 20.10 has
no CDI and `--gpus` needs the NVIDIA runtime: what docker makes of tfctl's `--gpus` is read back
from a created container, and the error a host without that runtime gives is checked to be the
runtime's, not a command line docker refused.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from bench.containers_lab import IMAGE, Lab
from bench.stand_in_gpus import StandInGpus
from bench.waiting import wait_until
from tests.conftest import FAKE_TASK, fake, free_ports, tfctl
from tests.test_cli_localhost import with_gpus
from tests.test_containers import box, conmons
from tfctl.supervisor import containers
from tfctl.supervisor.protocol import ContainerLaunch

HOST_GPUS = 4


def gpu_cluster(dirpath: Path, runtime: str) -> Path:
    """A ps with no GPU and two workers with two each, in containers, that print the device nodes
    they have and what CUDA_VISIBLE_DEVICES and `{gpus}` (the host's numbers) say, then serve."""
    ports = free_ports(3)
    show = fake("--name {job_name}{task_index} --devices --port -1 --sleep -1")
    path = dirpath / "cluster.yaml"
    path.write_text(f"""name: gpubox
grace_period: 2
startup_timeout: 30
container: {{image: {IMAGE}, runtime: {runtime}, mounts: ["{FAKE_TASK.parent}:{FAKE_TASK.parent}:ro"]}}
command: "echo nodes $(ls /dev | grep ^nvidia); exec {show}"
env: {{ENV_GPUS: "{{gpus}}"}}
jobs:
  ps: {{hosts: [localhost:{ports[0]}], gpus: 0}}
  worker: {{hosts: [localhost:{ports[1]}, localhost:{ports[2]}], gpus: 2}}
""")
    return path


def seen_in_containers(cluster: Path, home: Path, env: dict[str, str]) -> dict[str, tuple[list[str], str, str]]:
    """task -> (its device nodes, CUDA_VISIBLE_DEVICES, the host's GPUs), once every task printed them."""

    def seen() -> dict[str, tuple[list[str], str, str]]:
        nodes: dict[str, list[str]] = {}
        found = {}
        for line in tfctl("-f", str(cluster), "logs", home=home, env=env).stdout.splitlines():
            task, _, text = line.partition(" ")
            task, text = task.strip("[]"), text.strip()  # the tasks' names are padded to one width
            words = text.split()
            if words[:1] == ["nodes"]:
                nodes[task] = words[1:]
            elif words[:1] == ["devices"] and task in nodes:
                shown = json.loads(text.split(" ", 1)[1])
                found[task] = (nodes[task], shown["cuda"], shown["env_gpus"])
        return found

    return wait_until(seen, 30, "every task printing its devices", until=lambda found: len(found) == 3, interval=0.3)


@pytest.fixture
def stand_in_gpus(podman_lab: Lab, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a tfctl whose localhost has HOST_GPUS stand-in GPUs, for nvidia-smi and
    for the podman lab."""
    with StandInGpus(tmp_path / "gpus", HOST_GPUS) as gpus:
        env = with_gpus(tmp_path, HOST_GPUS)
        yield {"PATH": f"{gpus.bin}{os.pathsep}{env['PATH']}"}


@pytest.fixture
def reap_after(podman_lab: Lab) -> Iterator[list[str]]:
    """Runs whose containers a failing test may have left: removed by label whatever happened."""
    runs: list[str] = []
    yield runs
    for run in runs:
        for name in podman_lab.containers(f"{containers.RUN_LABEL}={run}"):
            podman_lab.cli("rm", "--force", name)


def test_each_podman_task_has_its_own_gpus_renumbered_from_0(
    tmp_path: Path, home: Path, podman_lab: Lab, stand_in_gpus: dict[str, str], reap_after: list[str]
) -> None:
    """worker:1 has the host's GPUs 2 and 3, as /dev/nvidia2 and /dev/nvidia3 and nothing else,
    and CUDA_VISIBLE_DEVICES=0,1 (what a CUDA program in the container numbers them); the ps, with
    no GPU, has no device node and an empty CUDA_VISIBLE_DEVICES."""
    cluster = gpu_cluster(tmp_path, "podman")
    up = tfctl("-f", str(cluster), "up", "-d", home=home, env=stand_in_gpus)
    assert up.returncode == 0, up.stderr
    run = up.stdout.strip()
    reap_after.append(run)
    assert f"{HOST_GPUS} GPUs" in up.stderr  # preflight ran the image with the host's GPUs
    try:
        assert seen_in_containers(cluster, home, stand_in_gpus) == {
            "ps:0": ([], "", ""),
            "worker:0": (["nvidia0", "nvidia1"], "0,1", "0,1"),
            "worker:1": (["nvidia2", "nvidia3"], "0,1", "2,3"),
        }
    finally:
        down = tfctl("-f", str(cluster), "down", home=home, env=stand_in_gpus)
    assert down.returncode == 0, down.stderr
    assert "3 containers stopped on 1 host; 0 remain" in down.stderr
    assert podman_lab.containers(f"{containers.RUN_LABEL}={run}") == [] and conmons(run) == []


@pytest.mark.parametrize(
    "runtime, said, fix",
    [
        ("podman", "unresolvable CDI devices nvidia.com/gpu=0", "nvidia-ctk cdi generate"),
        ("docker", 'could not select device driver "" with capabilities: [[gpu]]', "nvidia-ctk runtime configure"),
    ],
    ids=["podman", "docker"],
)
def test_a_runtime_that_cannot_give_gpus_stops_up_in_preflight_saying_what_is_missing(
    tmp_path: Path, home: Path, runtime: str, said: str, fix: str, request: pytest.FixtureRequest
) -> None:
    """No CDI spec for podman, no NVIDIA runtime for docker: preflight runs the image with the
    host's GPUs, and says what the runtime said and what the host needs, before anything starts."""
    if any(os.path.exists(d) for d in ("/etc/cdi", "/var/run/cdi")) or shutil.which("nvidia-container-runtime-hook"):
        pytest.skip("this machine has CDI specs or the NVIDIA runtime hook; the test needs a host without")
    request.getfixturevalue(f"{runtime}_lab")
    cluster = gpu_cluster(tmp_path, runtime)
    up = tfctl("-f", str(cluster), "up", home=home, env=with_gpus(tmp_path, HOST_GPUS))
    assert up.returncode == 1, up.stderr
    assert f"localhost: {runtime} cannot give a container the host's GPUs (" in up.stderr
    assert said in up.stderr and fix in up.stderr, up.stderr  # docker took the --gpus value: its daemon refused
    assert "starting on" not in up.stderr and "Traceback" not in up.stderr


def test_docker_reads_the_gpus_tfctl_gives_as_those_devices(docker_lab: Lab) -> None:
    """docker parses `--gpus` as CSV: unquoted, `device=2,3` would ask for one GPU, device 2."""
    gpu_options = containers.Docker("docker").gpu_options(["2", "3"])
    created = docker_lab.cli("create", *gpu_options, IMAGE, "true").strip()
    try:
        asked = json.loads(docker_lab.cli("inspect", "--format", "{{json .HostConfig.DeviceRequests}}", created))
    finally:
        docker_lab.cli("rm", created)
    assert [(r["DeviceIDs"], r["Count"], r["Capabilities"]) for r in asked] == [(["2", "3"], 0, [["gpu"]])]


@pytest.mark.parametrize("runtime_name", ["podman", "docker", "apptainer"])
def test_a_task_without_gpus_gets_no_gpu_options_and_sees_none(runtime_name: str) -> None:
    """`gpus: 0` beside tasks with GPUs: no device at all (docker's `--gpus "device="` asks for a
    device named ""), and CUDA_VISIBLE_DEVICES empty."""
    argv = box(runtime_name, {"CUDA_VISIBLE_DEVICES": ""})
    assert not {"--gpus", "--device", "--nv"} & set(argv)
    assert "CUDA_VISIBLE_DEVICES=" in argv
    spec = ContainerLaunch("img:1", runtime_name)
    probing = containers.RUNTIMES[runtime_name](f"/usr/bin/{runtime_name}").python(spec, "print(1)", ["0", "1"])
    assert {"--gpus", "--device", "--nv"} & set(probing)  # preflight runs the image with the host's GPUs
