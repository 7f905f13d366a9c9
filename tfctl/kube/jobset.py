"""A JobSet, or an Indexed Job with its Service, from a cluster file: Kubernetes without Kubeflow.

Neither controller knows TensorFlow: they give each pod a stable DNS name and an index, and no
TF_CONFIG. The names are known here (`<jobset>-<replicated job>-<job index>-0.<subdomain>` for a
JobSet, `<job>-<completion index>.<service>` for an Indexed Job), so the cluster is written into
the manifest, and LAUNCHER, a few lines of Python in the pod's command, turns the pod's index
into its task: its TF_CONFIG (exactly as `up` makes it), its placeholders, its command. The image
needs nothing of tfctl.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable

from tfctl.backends.base import backend_for
from tfctl.config.model import Address, ClusterConfig, RestartPolicy
from tfctl.kube import pods
from tfctl.tf.tasks import cluster_spec, decisive_tasks, placeholder_values

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# The JobSet controller annotates each pod with the index of its Job in its replicated job.
JOB_INDEX_ANNOTATION = "jobset.sigs.k8s.io/job-index"
JOB_INDEX_ENV = "TFCTL_JOB_INDEX"  # that annotation in the container, through the downward API
JOB_INDEX_FIELD = f"metadata.annotations['{JOB_INDEX_ANNOTATION}']"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"  # what Kubernetes sets in an Indexed Job's pods
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # on every pod of a Job (Kubernetes 1.27 and later)
# Replicated jobs in the order they are created: a `dependsOn` names one before it.
JOBSET_ORDER = ("ps", "evaluator", "chief", "worker")
# Exit codes 1-127 are a program's own verdict: `exit-code` restarts only after a signal or 128+.
PERMANENT_EXIT_CODES = list(range(1, 128))
LAUNCHER = (
    """\
# tfctl export: this pod's task from the index Kubernetes gives it, its TF_CONFIG, then its command
import json, os, shlex, sys
pod = int(os.environ[sys.argv[1]])
start, job, first, command, env = [part for part in json.loads(sys.argv[3]) if part[0] <= pod][-1]
index = first + pod - start
tf = {"cluster": json.loads(sys.argv[2]), "task": {"type": job, "index": index}}
os.environ.update(env, TF_CONFIG=json.dumps(tf, separators=(",", ":")))
values = {"job_name": job, "task_index": str(index)}
"""
    + pods.RUN_FILLED
)


@dataclass(frozen=True)
class Part:
    """Tasks `first`.. of `job`, run by the pods whose index is `start`.. (as many as `count`);
    in a JobSet, the replicated job `name`."""

    name: str
    job: str
    first: int
    count: int
    start: int = 0


def jobset_manifest(config: ClusterConfig) -> dict[str, Any]:
    """The JobSet: one replicated job per job, of one Job (one pod) per task; raises ConfigError
    when the file lacks `kubernetes.image` or its name cannot name the pods."""
    pods.require_image(config, "jobset", list(config.jobs))
    config, _ = backend_for(config.backend).stand_in(config, per_task=True)  # one pod per task
    parts = _replicated_jobs(config)
    longest = max((f"-{part.name}-{part.count - 1}-0" for part in parts), key=len)
    name = pods.resource_name(config, "JobSet", longest=longest)
    owner = {(part.job, part.first + i): (part, i) for part in parts for i in range(part.count)}

    def address(job: str, index: int) -> str:
        part, i = owner[job, index]
        return f"{name}-{part.name}-{i}-0.{name}"

    pod_config = _named(config, address)
    after = _start_after(config, parts)
    replicated = []
    for part in parts:
        job = config.jobs[part.job]
        command = _launch(config, pod_config, name, [part], JOB_INDEX_ENV, {})
        box = pods.container(config, part.job, command, pods.run_env(config, part.job, name), pods.limits(job))
        box["env"].append({"name": JOB_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOB_INDEX_FIELD}}})
        if part in after.values():  # another waits until it is Ready: Ready must mean listening
            box["readinessProbe"] = {"tcpSocket": {"port": pods.job_port(job)}, "periodSeconds": 2}
        entry: dict[str, Any] = {"name": part.name, "replicas": part.count}
        if part in after:
            entry["dependsOn"] = [{"name": after[part].name, "status": "Ready"}]
        restart = job.restart or RestartPolicy("never", 0)
        job_spec, policy = _restarts(restart.policy, restart.max_restarts, per_index=False)
        job_spec["template"] = {"spec": pods.pod_spec(config, box, policy)}
        entry["template"] = {"spec": job_spec}
        replicated.append(entry)
    decisive = {owner[job, int(index)][0] for job, index in (t.split(":") for t in decisive_tasks(config))}
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": config.kubernetes.namespace},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True},
            "successPolicy": {
                "operator": "All",
                "targetReplicatedJobs": [p.name for p in parts if p in decisive],
            },
            "replicatedJobs": replicated,
        },
    }


def _replicated_jobs(config: ClusterConfig) -> list[Part]:
    """A replicated job per job, but worker 0 in one of its own (`worker0`) when it alone decides
    success (no chief), as a JobSet's success policy names whole replicated jobs, or when the
    other workers wait for it (`_start_after`)."""
    decisive = set(decisive_tasks(config))
    leads = config.start_order == "ordered" and "ps" in config.jobs and "chief" not in config.jobs
    parts = []
    for job in (j for j in JOBSET_ORDER if j in config.jobs):
        count = len(config.jobs[job].addresses)
        mine = [i for i in range(count) if f"{job}:{i}" in decisive]
        if job == "worker" and count > 1 and (mine == [0] or leads):
            parts += [Part(f"{job}0", job, 0, 1), Part(job, job, 1, count - 1)]
        else:
            parts.append(Part(job, job, 0, count))
    return parts


def _start_after(config: ClusterConfig, parts: list[Part]) -> dict[Part, Part]:
    """What waits for what to be Ready, as `start_order: ordered` starts tasks: the chief and
    workers after the ps, and without a chief the other workers after worker 0 (each replicated
    job may wait for one other). `together` starts everything at once."""
    if config.start_order != "ordered" or "ps" not in config.jobs:
        return {}
    ps = next(p for p in parts if p.job == "ps")
    after = {p: ps for p in parts if p.job in ("chief", "worker")}
    workers = [p for p in parts if p.job == "worker"]
    if "chief" not in config.jobs and len(workers) == 2:
        after[workers[1]] = workers[0]
    return after


def indexed_job_manifests(config: ClusterConfig) -> list[dict[str, Any]]:
    """A headless Service and one Indexed Job whose completion indexes are the tasks, in task
    order; raises ConfigError when the file lacks `kubernetes.image` or a usable name."""
    pods.require_image(config, "indexed-job", [None])
    config, _ = backend_for(config.backend).stand_in(config, per_task=True)  # one pod per task
    tasks = config.tasks()
    name = pods.resource_name(config, "Job", longest=f"-{len(tasks) - 1}")
    pod_index = {(job, index): k for k, (job, index, _) in enumerate(tasks)}
    pod_config = _named(config, lambda job, index: f"{name}-{pod_index[job, index]}.{name}")
    parts = [Part(job, job, 0, len(spec.addresses), pod_index[job, 0]) for job, spec in config.jobs.items()]
    # One pod template for every task: the env all jobs share is the container's, a job's own
    # comes with its command; the limits and restarts are the most any job asks for.
    envs = {part.job: pods.run_env(config, part.job, name) for part in parts}
    shared = {k: v for k, v in envs[parts[0].job].items() if all(env.get(k) == v for env in envs.values())}
    own = {job: {k: v for k, v in env.items() if k not in shared} for job, env in envs.items()}
    most: dict[str, int] = {}
    for spec in config.jobs.values():
        for key, count in pods.limits(spec).items():
            most[key] = max(most.get(key, 0), count)
    command = _launch(config, pod_config, name, parts, COMPLETION_INDEX_ENV, own)
    box = pods.container(config, None, command, shared, most)
    restarts = [spec.restart for spec in config.jobs.values() if spec.restart and spec.restart.policy != "never"]
    policies = {r.policy for r in restarts}
    job_spec, policy = _restarts(
        "exit-code" if policies == {"exit-code"} else "on-failure" if restarts else "never",
        max((r.max_restarts for r in restarts), default=0),
        per_index=True,
    )
    decisive = ",".join(str(pod_index[job, int(i)]) for job, i in (t.split(":") for t in decisive_tasks(config)))
    metadata = {"name": name, "namespace": config.kubernetes.namespace}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {JOB_NAME_LABEL: name}},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "completionMode": "Indexed",
            "completions": len(tasks),
            "parallelism": len(tasks),
            **job_spec,
            "successPolicy": {"rules": [{"succeededIndexes": decisive}]},
            "template": {"spec": {"subdomain": name, **pods.pod_spec(config, box, policy)}},
        },
    }
    return [service, job]


def _named(config: ClusterConfig, host: Callable[[str, int], str]) -> ClusterConfig:
    """The cluster with each task's address the pod's DNS name (and the job's port)."""
    jobs = {}
    for job, spec in config.jobs.items():
        port = pods.job_port(spec)
        jobs[job] = replace(spec, addresses=tuple(Address(host(job, i), port) for i in range(len(spec.addresses))))
    return replace(config, jobs=MappingProxyType(jobs))


def _launch(
    config: ClusterConfig,
    pod_config: ClusterConfig,
    name: str,
    parts: list[Part],
    index_env: str,
    own_env: dict[str, dict[str, str]],
) -> list[str]:
    """LAUNCHER's command line for `parts`: the variable holding the pod's index, the cluster,
    and per part its command with every placeholder but the task's own filled, and its env
    beyond the container's."""
    values = pods.run_values(config, name)
    hosts = placeholder_values(pod_config, "", 0, "", name)
    values.update({key: shlex.quote(hosts[key]) for key in hosts if key.endswith("_hosts")})
    table = [
        [p.start, p.job, p.first, pods.for_launcher(config.command_for(p.job), values), own_env.get(p.job, {})]
        for p in parts
    ]
    return ["python", "-c", LAUNCHER, index_env, _json(cluster_spec(pod_config)), _json(table)]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _restarts(policy: str, max_restarts: int, *, per_index: bool) -> tuple[dict[str, Any], str]:
    """A Job's settings for a `restart:` policy, and its pods' restartPolicy.

    A Job of a JobSet is one task, so `backoffLimit` is that task's `max_restarts`, and
    `on-failure` restarts the container in place. An Indexed Job counts restarts per index, and
    fails as soon as one index has used them up; that, and `exit-code` (a failure policy on exit
    codes 1-127), need failed pods replaced instead, with the same index.
    """
    limit = max_restarts if policy != "never" else 0
    spec: dict[str, Any] = (
        {"backoffLimitPerIndex": limit, "maxFailedIndexes": 0} if per_index else {"backoffLimit": limit}
    )
    if policy == "exit-code":
        codes = {"containerName": pods.CONTAINER, "operator": "In", "values": PERMANENT_EXIT_CODES}
        action = "FailIndex" if per_index else "FailJob"  # either ends the run, as it ends tfctl's
        spec["podFailurePolicy"] = {"rules": [{"action": action, "onExitCodes": codes}]}
    return spec, "OnFailure" if policy == "on-failure" and not per_index else "Never"


def jobset_yaml(config: ClusterConfig) -> str:
    return pods.to_yaml(config, "JobSet", "jobset", [jobset_manifest(config)])


def indexed_job_yaml(config: ClusterConfig) -> str:
    return pods.to_yaml(config, "Indexed Job and its headless Service", "indexed-job", indexed_job_manifests(config))
