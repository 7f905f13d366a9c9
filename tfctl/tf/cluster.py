"""Turning a cluster file into TensorFlow tasks: TF_CONFIG, the classic flags, the start order.

The orchestrator knows nothing of TensorFlow; this module tells it which tasks to start, with
which command and environment, in which phases, and which tasks decide that the job is done.
"""

from __future__ import annotations

import json
import shlex
import string

from tfctl.config import ClusterConfig
from tfctl.orchestrator import Phase
from tfctl.runs import TaskSpec

# Jobs whose tasks run a tf.train.Server / tf.distribute.Server and so listen on their port.
# The evaluator of TF's sidecar evaluation is no server and is not part of the training cluster.
SERVER_JOBS = ("chief", "ps", "worker")
# Jobs that must keep running for the job to make progress: their end before completion is fatal.
ESSENTIAL_JOBS = ("ps",)
DEFAULT_ENV = {
    # A Python task writing to a file buffers 8 KB at a time; logs must arrive as they are printed.
    "PYTHONUNBUFFERED": "1",
}


def cluster_spec(config: ClusterConfig) -> dict[str, list[str]]:
    """The `cluster` part of TF_CONFIG: every server job, task index = position."""
    return {job: [str(a) for a in config.jobs[job].addresses] for job in config.jobs if job in SERVER_JOBS}


def tf_config(config: ClusterConfig, job: str, index: int) -> str:
    """TF_CONFIG exactly as tf.distribute's TFConfigClusterResolver reads it."""
    return json.dumps({"cluster": cluster_spec(config), "task": {"type": job, "index": index}},
                      separators=(",", ":"))


def placeholder_values(config: ClusterConfig, job: str, index: int, python: str, run_id: str) -> dict[str, str]:
    """Values for the command placeholders; the host lists are the classic comma-joined flags."""
    def hosts(name: str) -> str:
        return ",".join(str(a) for a in config.jobs[name].addresses) if name in config.jobs else ""

    return {
        "job_name": job,
        "task_index": str(index),
        "ps_hosts": hosts("ps"),
        "worker_hosts": hosts("worker"),
        "chief_hosts": hosts("chief"),
        "evaluator_hosts": hosts("evaluator"),
        "python": python,
        "run_id": run_id,
    }


def render_command(template: str, values: dict[str, str]) -> str:
    """Fill placeholders, each value shell-quoted (an empty host list becomes '')."""
    out = []
    for literal, field_name, _spec, _conv in string.Formatter().parse(template):
        out.append(literal)
        if field_name is not None:
            out.append(shlex.quote(values[field_name]))
    return "".join(out)


def plan_tasks(config: ClusterConfig, run_id: str, python_for: dict[str, str]) -> list[TaskSpec]:
    """Every task of the cluster with its rendered command and environment.

    `python_for` maps host -> interpreter, so `{python}` is right on every host.
    """
    tasks = []
    cwd = str(config.workdir) if config.workdir else str(config.path.resolve().parent)
    for job, index, address in config.tasks():
        values = placeholder_values(config, job, index, python_for[address.host], run_id)
        env = {**DEFAULT_ENV, **config.env_for(job), "TF_CONFIG": tf_config(config, job, index)}
        tasks.append(TaskSpec(job=job, index=index, host=address.host, port=address.port,
                              command=render_command(config.command_for(job), values), env=env, cwd=cwd))
    return tasks


def start_phases(tasks: list[TaskSpec]) -> list[Phase]:
    """ps and evaluator first, ps waited for until they listen; then chief and workers."""
    first = tuple(t for t in tasks if t.job in ("ps", "evaluator"))
    rest = tuple(t for t in tasks if t.job not in ("ps", "evaluator"))
    phases = []
    if first:
        phases.append(Phase(first, tuple(t.name for t in first if t.job in SERVER_JOBS)))
    if rest:
        phases.append(Phase(rest))
    return phases


def decisive_tasks(config: ClusterConfig) -> list[str]:
    """Tasks whose success means the job is done: the chief (or worker 0), or all workers."""
    if config.success_policy == "all_workers":
        names = [f"worker:{i}" for i in range(len(config.jobs["worker"].addresses))] if "worker" in config.jobs else []
        return (["chief:0"] if "chief" in config.jobs else []) + names
    return ["chief:0"] if "chief" in config.jobs else ["worker:0"]


def essential_tasks(tasks: list[TaskSpec]) -> list[str]:
    return [t.name for t in tasks if t.job in ESSENTIAL_JOBS]


def listens(task: TaskSpec) -> bool:
    return task.job in SERVER_JOBS
