"""A Kubeflow TFJob manifest from a cluster file, so a launch moves to Kubernetes unchanged.

The training operator starts one pod per task and sets TF_CONFIG in each, so what differs from
task to task ({job_name}, {task_index} and the host lists, which name the operator's services)
is known only in the pod: there, LAUNCHER fills those placeholders from TF_CONFIG, as tfctl
fills them (each value shell-quoted), and hands the command to `sh -c`, as tfctl does.
"""

from __future__ import annotations

import string
from typing import Any

from tfctl.backends.base import backend_for
from tfctl.config.model import ClusterConfig
from tfctl.kube import pods

API_VERSION = "kubeflow.org/v1"
REPLICA_TYPES = {"chief": "Chief", "ps": "PS", "worker": "Worker", "evaluator": "Evaluator"}
RESTART_POLICIES = {"never": "Never", "on-failure": "OnFailure", "exit-code": "ExitCode"}
PORT_NAME = "tfjob-port"
# What only the pod knows: filled by LAUNCHER from TF_CONFIG (task type and index, cluster).
POD_PLACEHOLDERS = ("job_name", "task_index", "ps_hosts", "worker_hosts", "chief_hosts", "evaluator_hosts")
LAUNCHER = (
    """\
# tfctl export: fill this task's placeholders from the operator's TF_CONFIG, then run the command
import json, os, shlex, sys
tf = json.loads(os.environ["TF_CONFIG"])
values = {"job_name": tf["task"]["type"], "task_index": str(tf["task"]["index"])}
for job in ("ps", "worker", "chief", "evaluator"):
    values[job + "_hosts"] = ",".join(tf["cluster"].get(job, []))
command = sys.argv[1]
"""
    + pods.RUN_FILLED
)


def manifest(config: ClusterConfig) -> dict[str, Any]:
    """The TFJob, one replica spec per job; raises ConfigError when a job has no image (`pods.image_for`)."""
    pods.require_image(config, "tfjob", list(config.jobs))
    config, _ = backend_for(config.backend).stand_in(config, per_task=True)  # one pod per task
    name = pods.resource_name(config, "TFJob")
    spec: dict[str, Any] = {
        "tfReplicaSpecs": {REPLICA_TYPES[job]: _replica(config, job, name) for job in config.jobs},
    }
    if config.success_policy == "all_workers":
        spec["successPolicy"] = "AllWorkers"
    spec["runPolicy"] = {"cleanPodPolicy": "Running"}  # as tfctl: a ps never outlives its job
    restarts = [j.restart.max_restarts for j in config.jobs.values() if j.restart and j.restart.policy != "never"]
    if restarts:
        spec["runPolicy"]["backoffLimit"] = max(restarts)  # TFJob counts restarts per job, not per task
    return {
        "apiVersion": API_VERSION,
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": config.kubernetes.namespace},
        "spec": spec,
    }


def _replica(config: ClusterConfig, job: str, name: str) -> dict[str, Any]:
    spec = config.jobs[job]
    box = pods.container(config, job, command(config, job, name), pods.run_env(config, job, name), pods.limits(spec))
    port = pods.job_port(spec)  # TFJob picks none itself: a port of the job's own is the container's
    if port != pods.DEFAULT_PORT:
        box["ports"] = [{"name": PORT_NAME, "containerPort": port}]
    policy = spec.restart.policy if spec.restart else "never"
    return {
        "replicas": len(spec.addresses),
        "restartPolicy": RESTART_POLICIES[policy],
        "template": {"spec": pods.pod_spec(config, box)},
    }


def command(config: ClusterConfig, job: str, name: str) -> list[str]:
    """The job's command for its pods: `sh -c` when every placeholder is known here, else LAUNCHER.

    A cluster of one task gets no TF_CONFIG from the operator, so its placeholders are all
    filled here.
    """
    values = pods.run_values(config, name)
    tasks = config.tasks()
    if len(tasks) == 1:
        job_name, _index, address = tasks[0]
        values.update(dict.fromkeys(POD_PLACEHOLDERS, "''"), job_name=job_name, task_index="0")
        values[f"{job_name}_hosts"] = f"localhost:{address.port or pods.DEFAULT_PORT}"
    parsed = list(string.Formatter().parse(config.command_for(job)))
    if all(field is None or field in values for _, field, _, _ in parsed):
        return ["sh", "-c", "".join(text + (values[field] if field else "") for text, field, _, _ in parsed)]
    return ["python", "-c", LAUNCHER, pods.for_launcher(config.command_for(job), values)]


def to_yaml(config: ClusterConfig) -> str:
    return pods.to_yaml(config, "Kubeflow TFJob", "tfjob", [manifest(config)])
