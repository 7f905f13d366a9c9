"""Tasks in containers through pyxis, NVIDIA's Slurm plugin (`srun --container-image`).

Where srun has pyxis, a node whose tasks run in a container is that container: every job step
tfctl runs there (its supervisor's conversations, each task's monitor, `exec`) starts in one
named container of the node's image, imported once per node before anything starts. The image's
Python is then the node's Python: preflight asks it, the monitors run with it, and the tasks run
in it bare. Slurm owns the container's life: its processes are the step's, ended with it, and
pyxis removes a named container when the job ends; no runtime runs in the step, and no tether.

Decided once per run: before Slurm is asked for the allocation, whether srun has pyxis and pyxis
can run each job's container (`first_look`), then, once the nodes are known, whether each node
gets one (`choose`). `slurm.containers: auto` takes pyxis where it can; else each step runs the
node's runtime as without pyxis (`tfctl/supervisor/containers.py`); `pyxis` makes either an
error, named before anything is asked of Slurm where it can be.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, List, Mapping

from tfctl.backends.slurm.allocation import Runner
from tfctl.backends.slurm.transport import end_step
from tfctl.config.model import ClusterConfig, ContainerSettings
from tfctl.errors import UsageError
from tfctl.supervisor.records import Wire, record

IMAGE_FLAG = "--container-image"  # pyxis adds it to srun (and to `srun --help`)
# What the supervisor names its files after (`supervisor.files.host_key`): the node's, seen in
# the container, so the supervisor and monitors there keep their files where the node's does.
MACHINE_IDS = ("/etc/machine-id", "/var/lib/dbus/machine-id")
SQUASHFS = (".sqsh", ".squashfs")
FIX = (
    "pyxis runs a registry image (`nvcr.io/nvidia/tensorflow:25.01-tf2-py3`) or a squashfs file"
    " (`enroot import -o /shared/train.sqsh podman://IMAGE`); or set `slurm.containers: runtime`"
    " to run the node's podman, docker or apptainer inside each step"
)
IMPORT_FIX = (
    "pyxis takes `registry#path:tag` (tfctl writes `nvcr.io/nvidia/x:1` so); a private registry"
    " needs enroot's credentials (~/.config/enroot/.credentials); a large image a larger"
    " `container.pull_timeout`; a squashfs file must be on every node"
)
# node -> its step's argv, the seconds they may take, who hears how long they took so far:
# node -> why each that failed did
StepsRunner = Callable[[Mapping[str, List[str]], float, Callable[[float], None]], Mapping[str, str]]
WAITING_EVERY = 10.0  # seconds between two lines while images are imported
POLL = 0.1


@record
class NodeContainer(Wire):
    """A node's container as the run record keeps it: what each step there adds to its srun,
    and the image's Python (the node's supervisor and the `{python}` of its tasks)."""

    options: List[str]
    python: str


@dataclass(frozen=True)
class Choice:
    """Who runs the run's containers: pyxis, in `nodes` (node -> its tasks' container), or, with
    no `nodes`, the runtime in each step; `why` not pyxis ("": pyxis holds them, or was out of
    the question: no container, or `slurm.containers: runtime`)."""

    nodes: Mapping[str, ContainerSettings]
    why: str = ""


def has_pyxis(run: Runner) -> bool:
    """Whether this Slurm's srun takes `--container-image` (pyxis adds it to `srun --help`)."""
    return IMAGE_FLAG in run(["srun", "--help"], None).stdout


def first_look(config: ClusterConfig, way: str, run: Runner) -> str | None:
    """Before Slurm is asked for anything: None where pyxis is out of the question (no task in
    a container, or `slurm.containers: runtime`); else why pyxis cannot hold the containers ("":
    it can, if each node gets one). Raises UsageError when `way` is `pyxis` and it cannot."""
    if way == "runtime" or not any(config.container_for(job) for job in config.jobs):
        return None
    why = "" if has_pyxis(run) else "this Slurm's srun has no --container-image (pyxis is not installed)"
    for job in config.jobs:
        box = config.container_for(job)
        key = f"jobs.{job}.container" if config.jobs[job].container else "container"
        why = why or ("" if box is None else _unfit(box, key))
    _refuse(way, why)
    return why


def choose(placed: ClusterConfig, way: str, looked: str | None) -> Choice:
    """How the placed cluster's containers run, as `slurm.containers` (`way`) says and as
    `first_look` found (`looked`); raises UsageError when it says `pyxis` and pyxis cannot."""
    if looked is None:
        return Choice({})
    nodes, why = _held(placed) if not looked else ({}, looked)
    _refuse(way, why)
    return Choice(nodes, why)


def _refuse(way: str, why: str) -> None:
    if why and way == "pyxis":
        raise UsageError(f"slurm.containers is pyxis, but {why}", hint=FIX)


def _held(placed: ClusterConfig) -> tuple[dict[str, ContainerSettings], str]:
    """node -> the one container its tasks run in; or why pyxis cannot hold them (it holds one
    per node)."""
    seen: dict[str, tuple[str, ContainerSettings | None]] = {}
    for job, _, address in placed.tasks():
        box = placed.container_for(job)
        other, other_box = seen.setdefault(address.host, (job, box))
        if other_box != box:
            return {}, f"jobs {other} and {job} share node {address.host} in different containers (or none)"
    return {node: box for node, (_, box) in seen.items() if box is not None}, ""


def _unfit(box: ContainerSettings, key: str) -> str:
    """Why pyxis cannot run this container ("": it can)."""
    if box.runtime != "auto":
        return f"`{key}.runtime` asks for {box.runtime}"
    if box.image.startswith("/") and not box.image.endswith(SQUASHFS):
        kind = "an image tarball" if box.image.endswith(".tar") else "a rootfs folder"
        return f"`{key}.image` is {kind} ({box.image}), which pyxis cannot run"
    if any("," in path for mount in box.mounts for path in mount.split(":")[:2]):
        return f"`{key}.mounts` has a path with a comma, which pyxis's --container-mounts cannot take"
    return ""


def enroot_uri(image: str) -> str:
    """`container.image` as pyxis takes it: a squashfs file as it is; a registry image with its
    registry split off by `#` (`nvcr.io/nvidia/tensorflow:25.01-tf2-py3` ->
    `nvcr.io#nvidia/tensorflow:25.01-tf2-py3`); a Docker Hub image as written."""
    if image.startswith("/") or "#" in image:
        return image
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def container_name(run_id: str) -> str:
    """The run's container on each node: its steps' after the first find it there."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"tfctl-{run_id}")


def node_container(run_id: str, box: ContainerSettings, root: str, workdir: str) -> NodeContainer:
    """A node's container: the image, named for the run, with tfctl's folder (the supervisor,
    the tasks' files, the run's folder) and the workdir at their own paths, the node's machine
    id, the user's mounts, as the user who ran `up` (not remapped to root), without the image's
    entrypoint (the step's command is tfctl's), then `container.options` as they are."""
    mounts = [f"{path}:{path}" for path in sorted({root, workdir})]
    mounts += [f"{path}:{path}:ro+nofail" for path in MACHINE_IDS]  # nofail: a node may lack one
    mounts += [_mount(mount) for mount in box.mounts]
    options = [
        f"{IMAGE_FLAG}={enroot_uri(box.image)}",
        f"--container-name={container_name(run_id)}",
        f"--container-mounts={','.join(mounts)}",
        f"--container-workdir={workdir}",
        "--no-container-remap-root",
        "--no-container-entrypoint",
        *box.options,
    ]
    return NodeContainer(options, box.python or "python3")


def _mount(mount: str) -> str:
    """`host:container[:a,b]` as pyxis takes it: flags joined by `+` (`,` separates mounts)."""
    host, container, *flags = mount.split(":")
    return ":".join([host, container, *(flag.replace(",", "+") for flag in flags)])


def without_containers(config: ClusterConfig) -> ClusterConfig:
    """The cluster as the nodes' supervisors see it once each node's steps run in its container:
    tasks that run bare there."""
    jobs = {name: dataclasses.replace(job, container=None) for name, job in config.jobs.items()}
    return dataclasses.replace(config, container=None, jobs=MappingProxyType(jobs))


def import_images(
    argvs: Mapping[str, List[str]], timeout: float, waiting: Callable[[float], None] = lambda _seconds: None
) -> dict[str, str]:
    """Run each node's first step in its container (its image imported there), all at once;
    node -> why it failed, for those that did (within `timeout` seconds). `waiting(seconds)`
    every WAITING_EVERY seconds meanwhile, or four times within a shorter `timeout`: a
    multi-GB import takes minutes, and must not look hung. Steps still running when this
    returns or raises are ended."""
    every = min(WAITING_EVERY, timeout / 4)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with tempfile.TemporaryDirectory(prefix="tfctl-import-") as errors:
        try:
            for node, argv in argvs.items():
                with open(os.path.join(errors, node), "wb") as err:  # a file: a pipe could fill and stall srun
                    procs[node] = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
                    )
            began = said = time.monotonic()
            while any(proc.poll() is None for proc in procs.values()) and time.monotonic() - began < timeout:
                if time.monotonic() - said >= every:
                    said = time.monotonic()
                    waiting(said - began)
                time.sleep(POLL)
            codes = {node: proc.poll() for node, proc in procs.items()}
        finally:
            for proc in procs.values():
                end_step(proc, patience=5.0)
        failed = {}
        for node, code in codes.items():
            if code is None:
                failed[node] = f"importing the image took more than {timeout:g}s (container.pull_timeout)"
            elif code:
                with open(os.path.join(errors, node), errors="replace") as err:
                    failed[node] = (err.read().strip().splitlines() or [f"srun exited {code}"])[-1]
    return failed
