"""Where each task of a `backend: slurm` cluster runs, once the allocation's nodes are known.

Jobs whose own `slurm:` keys differ ask for different nodes: each group of alike jobs is one
component of a Slurm heterogeneous job (`Component`), and its tasks go to that component's nodes.
Within a component the parameter servers go first, one per node, so they never share a node while
one is free; then the chief, workers and evaluator continue round the nodes. Two tasks on one node
get different ports: the job's port, else the next free one; a job without `port` has its ports
chosen on each node at start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

from tfctl.backends.slurm.settings import SlurmJobSettings, SlurmSettings
from tfctl.config.model import CHOSEN_AT_START, Address, ClusterConfig, Job

ORDER = ("ps", "chief", "worker", "evaluator")


def settings_of(config: ClusterConfig) -> SlurmSettings:
    """The cluster file's `slurm:` section (Slurm's defaults where it has none)."""
    settings = config.backend_settings
    return settings if isinstance(settings, SlurmSettings) else SlurmSettings()


def task_count(config: ClusterConfig) -> int:
    return sum(job.count or 0 for job in config.jobs.values())


def node_count(config: ClusterConfig) -> int:
    """How many nodes the allocation asks for: one per task, unless `slurm.nodes` caps it."""
    tasks = task_count(config)
    return min(settings_of(config).nodes or tasks, tasks)


@dataclass(frozen=True)
class Component:
    """What one group of alike jobs asks Slurm for: one component of a heterogeneous job (or the
    whole allocation when every job asks for the same). `gpus`: all its tasks' GPUs; `cpus`: the
    cores of its hungriest task, for every task."""

    jobs: tuple[str, ...]
    nodes: int
    tasks: int
    partition: str | None = None
    constraint: str | None = None
    mem: str | None = None
    gpus: int = 0
    cpus: int = 0
    extra: tuple[str, ...] = ()

    def describe(self) -> str:
        """`ps on partition cpu, 1 node`, for `up --dry-run`."""
        asks = [f"partition {self.partition}"] if self.partition else []
        asks += [f"constraint {self.constraint}"] if self.constraint else []
        asks += [f"mem {self.mem}"] if self.mem else []
        asks += [f"{self.nodes} node" + ("s" if self.nodes > 1 else "")]
        asks += [f"{self.gpus} GPU" + ("s" if self.gpus > 1 else "")] if self.gpus else []
        return f"{', '.join(self.jobs)} on {', '.join(asks)}"


def own_settings(job: Job) -> SlurmJobSettings:
    return job.own if isinstance(job.own, SlurmJobSettings) else SlurmJobSettings()


def components(config: ClusterConfig) -> tuple[Component, ...]:
    """One component per group of jobs whose own `slurm:` keys are alike (unset keys are the
    section's); a single one, asking as the `slurm:` section says, when all jobs are alike."""
    section = settings_of(config)
    groups: dict[SlurmJobSettings, list[Job]] = {}
    for job in config.jobs.values():
        own = own_settings(job)
        groups.setdefault(dataclasses.replace(own, partition=own.partition or section.partition), []).append(job)
    if len(groups) == 1:
        ((own, jobs),) = groups.items()
        return (_component(own, jobs, node_count(config), section),)
    return tuple(
        _component(own, jobs, min(own.nodes or _tasks(jobs), _tasks(jobs)), section) for own, jobs in groups.items()
    )


def _tasks(jobs: Sequence[Job]) -> int:
    return sum(job.count or 0 for job in jobs)


def _component(own: SlurmJobSettings, jobs: Sequence[Job], nodes: int, section: SlurmSettings) -> Component:
    return Component(
        jobs=tuple(job.name for job in jobs),
        nodes=min(own.nodes or nodes, nodes),
        tasks=_tasks(jobs),
        partition=own.partition,
        constraint=own.constraint,
        mem=own.mem,
        gpus=sum((job.gpus or 0) * (job.count or 0) for job in jobs),
        cpus=max((job.cpus or 0) for job in jobs),
        extra=(*section.extra, *own.extra),
    )


def place(config: ClusterConfig, nodes: tuple[str, ...] | Mapping[str, tuple[str, ...]]) -> ClusterConfig:
    """The same cluster with every job's addresses on `nodes` (all jobs'), or on job -> its
    component's nodes."""
    nodes_of = {name: nodes for name in config.jobs} if isinstance(nodes, tuple) else nodes
    used: dict[str, set[int]] = {node: set() for group in nodes_of.values() for node in group}
    placed: dict[str, list[Address]] = {}
    turns: dict[tuple[str, ...], int] = {}  # per component: the next of its nodes
    for name in ORDER:
        job = config.jobs.get(name)
        if job is None:
            continue
        group = nodes_of[name]
        placed[name] = []
        for _ in range(job.count or 0):
            turn = turns.get(group, 0)
            node = group[turn % len(group)]
            turns[group] = turn + 1
            port = job.port or CHOSEN_AT_START  # without `port`: each node's supervisor picks one at start
            while port != CHOSEN_AT_START and port in used[node]:
                port += 1
            used[node].add(port)
            placed[name].append(Address(node, port))
    jobs = {name: dataclasses.replace(job, addresses=tuple(placed[name])) for name, job in config.jobs.items()}
    return dataclasses.replace(config, jobs=MappingProxyType(jobs))


def nodes_by_job(config: ClusterConfig, nodes: Sequence[tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """job -> the nodes of its component, from each component's nodes in order."""
    return {job: group for component, group in zip(components(config), nodes) for job in component.jobs}


def step_options(config: ClusterConfig, heterogeneous: bool = True) -> dict[str, list[str]]:
    """task -> what its job step asks Slurm for beyond one task: its component (in a heterogeneous
    job tfctl asked for), and its GPUs and cores. A step with GPUs has them to itself (two tasks on
    a node get different ones), and only what it asks for (`--exact`: else it would take every
    core of the node, and the next task's step would wait for it to end); every other step shares
    the node's resources (`--overlap`), so it starts at once."""
    options = {}
    parts = components(config)
    for index, component in enumerate(parts):
        group = [f"--het-group={index}"] if len(parts) > 1 and heterogeneous else []
        for name in component.jobs:
            job = config.jobs[name]
            asks = [f"--gpus={job.gpus}", "--exact"] if job.gpus else ["--overlap"]
            asks += [f"--cpus-per-task={job.cpus}"] if job.cpus else []
            for task in range(job.count or 0):
                options[f"{name}:{task}"] = [*group, *asks]
    return options
