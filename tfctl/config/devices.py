"""Placing tasks on their hosts' GPUs and cores: which task gets which, before anything starts.

Pure: the hosts' devices come from preflight (`supervisor/devices.py` on each host), the asks
from the cluster file's `gpus` and `cpus`; `tf/cluster.py` turns each placement into the task's
CUDA_VISIBLE_DEVICES, and the task's monitor pins it to its cores.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from tfctl.errors import UsageError


@dataclass(frozen=True)
class HostDevices:
    """What a host offers its tasks: GPU indices as nvidia-smi numbers them, and the cores its
    supervisor may run on. `gpu_error`: why it has no GPU (no nvidia-smi, no driver)."""

    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()
    gpu_error: str | None = None


@dataclass(frozen=True)
class DeviceAsk:
    """What one task asks its host for; None: nothing of that kind is managed for it."""

    task: str
    host: str
    gpus: int | None = None
    cpus: int | None = None


@dataclass(frozen=True)
class Placement:
    """One task's devices. `gpus`: its CUDA_VISIBLE_DEVICES (() hides every GPU; None leaves it
    unset); `cpus`: the cores it runs on (None: any)."""

    gpus: tuple[int, ...] | None = None
    cpus: tuple[int, ...] | None = None


class DeviceError(UsageError):
    """Tasks ask a host for more GPUs or cores than it has: the cluster file must change."""


def gpu_hosts(asks: Iterable[DeviceAsk]) -> set[str]:
    """The hosts whose GPUs must be known: those where some task asks for at least one."""
    return {ask.host for ask in asks if ask.gpus}


def enough_for(asks: Sequence[DeviceAsk]) -> dict[str, HostDevices]:
    """Hosts with exactly the GPUs and cores their tasks ask for, numbered from 0: how a placement
    looks before any host was asked (`up --dry-run`)."""
    gpus: dict[str, int] = defaultdict(int)
    cpus: dict[str, int] = defaultdict(int)
    for ask in asks:
        gpus[ask.host] += ask.gpus or 0
        cpus[ask.host] += ask.cpus or 0
    return {host: HostDevices(tuple(range(gpus[host])), tuple(range(cpus[host]))) for host in {a.host for a in asks}}


def place(asks: Sequence[DeviceAsk], hosts: Mapping[str, HostDevices]) -> dict[str, Placement]:
    """Each task's devices: per host, tasks in the order given take the next GPUs and the next
    cores, so no two tasks share one. A task without `gpus` on a host where others got GPUs gets
    none (a ps would otherwise take their memory); a host where no task asks keeps its defaults.
    Raises DeviceError naming every host whose tasks ask for more than it has."""
    by_host: dict[str, list[DeviceAsk]] = defaultdict(list)
    for ask in asks:
        by_host[ask.host].append(ask)
    problems: list[str] = []
    fixes: list[str] = []
    placed: dict[str, Placement] = {}
    for host, tasks in by_host.items():
        have = hosts.get(host, HostDevices())
        for key, offered, asked in (
            ("gpus", have.gpus, {a.task: a.gpus for a in tasks if a.gpus}),
            ("cpus", have.cpus, {a.task: a.cpus for a in tasks if a.cpus}),
        ):
            if sum(asked.values()) > len(offered):
                why = have.gpu_error if key == "gpus" and not offered else None
                problems.append(_shortage(host, key, len(offered), asked, why))
                fixes.append(_fix(host, key, asked, why))
        gpus_used = any(a.gpus for a in tasks)
        next_gpu = next_cpu = 0
        for a in tasks:
            gpus = None
            if a.gpus is not None or gpus_used:
                gpus = have.gpus[next_gpu : next_gpu + (a.gpus or 0)]
                next_gpu += a.gpus or 0
            cpus = None
            if a.cpus:
                cpus = have.cpus[next_cpu : next_cpu + a.cpus]
                next_cpu += a.cpus
            placed[a.task] = Placement(gpus, cpus)
    if problems:
        raise DeviceError("\n".join(problems), hint="; ".join(dict.fromkeys(fixes)))
    return placed


def _shortage(host: str, key: str, have: int, asked: Mapping[str, int], why: str | None) -> str:
    """`localhost has 4 GPUs; its tasks ask for 6: worker:0 2, worker:1 2, worker:2 2`."""
    kind = "GPU" if key == "gpus" else "CPU core"
    return (
        f"{host} has {_count(have, kind)}{f' ({why})' if why else ''}; its tasks ask for {sum(asked.values())}: "
        + ", ".join(f"{task} {count}" for task, count in asked.items())
    )


def _fix(host: str, key: str, asked: Mapping[str, int], why: str | None) -> str:
    jobs = sorted({task.split(":")[0] for task in asked})
    where = f"job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}"
    if why:
        return f"install the NVIDIA driver on {host} (nvidia-smi must be on its PATH), or remove `gpus` from {where}"
    return f"lower `{key}` of {where}, or move some of those tasks to another host"


def _count(number: int, kind: str) -> str:
    return f"{number} {kind}{'s' if number != 1 else ''}"
