"""A Kubeflow TFJob manifest from a cluster file, so a launch moves to Kubernetes unchanged.

The training operator starts one pod per task and sets TF_CONFIG in each, so what differs from
task to task ({job_name}, {task_index} and the host lists, which name the operator's services)
is known only in the pod: there, LAUNCHER fills those placeholders from TF_CONFIG, as tfctl
fills them (each value shell-quoted), and hands the command to `sh -c`, as tfctl does.
"""

from __future__ import annotations

import os
import re
import string
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tfctl import backends
from tfctl.config.model import ClusterConfig
from tfctl.errors import ConfigError, ConfigProblem, UsageError
from tfctl.tf.tasks import task_env
from tfctl.transport.base import shell_path

API_VERSION = "kubeflow.org/v1"
REPLICA_TYPES = {"chief": "Chief", "ps": "PS", "worker": "Worker", "evaluator": "Evaluator"}
RESTART_POLICIES = {"never": "Never", "on-failure": "OnFailure", "exit-code": "ExitCode"}
# The operator requires this container name, and uses this port unless the container names its own.
CONTAINER = "tensorflow"
DEFAULT_PORT = 2222
PORT_NAME = "tfjob-port"
# What only the pod knows: filled by LAUNCHER from TF_CONFIG (task type and index, cluster).
POD_PLACEHOLDERS = ("job_name", "task_index", "ps_hosts", "worker_hosts", "chief_hosts", "evaluator_hosts")
LAUNCHER = """\
# tfctl export: fill this task's placeholders from the operator's TF_CONFIG, then run the command
import json, os, shlex, sys
tf = json.loads(os.environ["TF_CONFIG"])
values = {"job_name": tf["task"]["type"], "task_index": str(tf["task"]["index"])}
for job in ("ps", "worker", "chief", "evaluator"):
    values[job + "_hosts"] = ",".join(tf["cluster"].get(job, []))
command = sys.argv[1].format(**{k: shlex.quote(v) for k, v in values.items()})
os.execvp("sh", ["sh", "-c", command])
"""
# A TFJob names its pods and services `<name>-<type>-<index>`: a service name is an RFC 1035 label.
_NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def tfjob_name(config: ClusterConfig) -> str:
    """The cluster name as Kubernetes accepts it: lowercase, `-` for `_` and `.`."""
    name = config.name.lower().replace("_", "-").replace(".", "-")
    if _NAME_RE.fullmatch(name):
        return name
    suggestion = name.strip("-") if name[:1].isalpha() else "tf-" + name.strip("-")
    raise ConfigError(
        [
            ConfigProblem(
                config.path,
                None,
                None,
                "name",
                f"`{config.name}` cannot name a TFJob ({name}): the operator names pods and services after it, "
                "and those names start with a letter and end with a letter or digit",
                f"rename the cluster, e.g. `name: {suggestion}`",
            )
        ]
    )


def manifest(config: ClusterConfig) -> dict[str, Any]:
    """The TFJob, one replica spec per job; raises ConfigError when the file lacks `kubernetes.image`."""
    if config.kubernetes.image is None:
        raise ConfigError(
            [
                ConfigProblem(
                    config.path,
                    None,
                    None,
                    "kubernetes.image",
                    "missing: `tfctl export tfjob` needs the container image the pods run",
                    "add `kubernetes: {image: registry/team/train:1.0}`, an image with TensorFlow and your code",
                )
            ]
        )
    config, _ = backends.get(config.backend).stand_in(config, per_task=True)  # one pod per task
    name = tfjob_name(config)
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
    settings, spec = config.kubernetes, config.jobs[job]
    env = {**task_env(config.env_for(job)), "TFCTL_RUN_ID": name, "TFCTL_RUN_DIR": f"/tmp/tfctl/{name}"}
    container: dict[str, Any] = {"name": CONTAINER, "image": settings.image}
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    container["command"] = [_literal(word) for word in command(config, job, name)]
    if settings.workdir:
        container["workingDir"] = settings.workdir
    container["env"] = [{"name": key, "value": _literal(value)} for key, value in env.items()]
    ports = {address.port or DEFAULT_PORT for address in spec.addresses}  # TFJob picks none itself
    if len(ports) == 1 and ports != {DEFAULT_PORT}:
        container["ports"] = [{"name": PORT_NAME, "containerPort": ports.pop()}]
    limits = {key: count for key, count in (("nvidia.com/gpu", spec.gpus), ("cpu", spec.cpus)) if count}
    if limits:
        container["resources"] = {"limits": limits}
    pod: dict[str, Any] = {"containers": [container]}
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    policy = spec.restart.policy if spec.restart else "never"
    return {"replicas": len(spec.addresses), "restartPolicy": RESTART_POLICIES[policy], "template": {"spec": pod}}


def command(config: ClusterConfig, job: str, name: str) -> list[str]:
    """The job's command for its pods: `sh -c` when every placeholder is known here, else LAUNCHER.

    `{python}` is the image's `python`, `{run_id}` the TFJob's name. A cluster of one task gets
    no TF_CONFIG from the operator, so its placeholders are all filled here.
    """
    values = {"python": "python", "run_id": name, "logdir": shell_path(config.logdir_for(name) or "")}
    tasks = config.tasks()
    if len(tasks) == 1:
        job_name, _index, address = tasks[0]
        values.update(dict.fromkeys(POD_PLACEHOLDERS, "''"), job_name=job_name, task_index="0")
        values[f"{job_name}_hosts"] = f"localhost:{address.port or DEFAULT_PORT}"
    parsed = list(string.Formatter().parse(config.command_for(job)))
    in_pod = any(field not in values for _, field, _, _ in parsed if field is not None)
    out = []
    for literal, field, _spec, _conversion in parsed:
        out.append(_braces(literal) if in_pod else literal)
        if field in values:
            out.append(_braces(values[field]) if in_pod else values[field])
        elif field is not None:
            out.append("{" + field + "}")
    return ["python", "-c", LAUNCHER, "".join(out)] if in_pod else ["sh", "-c", "".join(out)]


def _braces(text: str) -> str:
    """Text LAUNCHER's str.format must keep as it is."""
    return text.replace("{", "{{").replace("}", "}}")


def _literal(text: str) -> str:
    """Kubernetes expands `$(VAR)` and turns `$$` into `$` in a container's command and env; doubling
    those dollars makes it hand the shell exactly what tfctl would."""
    return re.sub(r"\$(?=[$(])", "$$", text)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (LAUNCHER) as `|` blocks, readable in the manifest."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def to_yaml(config: ClusterConfig) -> str:
    header = f"# Kubeflow TFJob from {config.path.name} (tfctl export tfjob): edit that file and export again\n"
    return header + yaml.dump(manifest(config), Dumper=_Dumper, sort_keys=False, width=1000)


def save(text: str, path: Path) -> None:
    """Write `path` whole or not at all: a half-written manifest must never reach `kubectl apply`."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}", hint="choose another -o FILE") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as error:
        os.unlink(tmp)
        raise UsageError(f"cannot write {path}: {error.strerror}", hint="choose another -o FILE") from None
