"""Where each task of a `backend: slurm` cluster runs, once the allocation's nodes are known.

The parameter servers go first, one per node, so they never share a node while one is free;
then the chief, workers and evaluator continue round the nodes. Two tasks on one node get
different ports: the job's port, else the next free one; a job without `port` has its
ports chosen on each node at start.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from tfctl.backends.slurm.settings import SlurmSettings
from tfctl.config.model import CHOSEN_AT_START, Address, ClusterConfig

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


def place(config: ClusterConfig, nodes: tuple[str, ...]) -> ClusterConfig:
    """The same cluster with every job's addresses on `nodes`."""
    used: dict[str, set[int]] = {node: set() for node in nodes}
    placed: dict[str, list[Address]] = {}
    turn = 0
    for name in ORDER:
        job = config.jobs.get(name)
        if job is None:
            continue
        placed[name] = []
        for _ in range(job.count or 0):
            node = nodes[turn % len(nodes)]
            turn += 1
            port = job.port or CHOSEN_AT_START  # without `port`: each node's supervisor picks one at start
            while port != CHOSEN_AT_START and port in used[node]:
                port += 1
            used[node].add(port)
            placed[name].append(Address(node, port))
    jobs = {name: dataclasses.replace(job, addresses=tuple(placed[name])) for name, job in config.jobs.items()}
    return dataclasses.replace(config, jobs=MappingProxyType(jobs))


def step_options(config: ClusterConfig) -> dict[str, list[str]]:
    """task -> what its job step asks Slurm for beyond one task: its GPUs and cores."""
    options = {}
    for name, job in config.jobs.items():
        asks = ([f"--gpus={job.gpus}"] if job.gpus else []) + ([f"--cpus-per-task={job.cpus}"] if job.cpus else [])
        for index in range(job.count or 0):
            options[f"{name}:{index}"] = asks
    return options
