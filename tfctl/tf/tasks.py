"""Turning a cluster file into TensorFlow tasks: TF_CONFIG, the classic flags, the start order.

The orchestrator knows nothing of TensorFlow; this module tells it which tasks to start, with
which command and environment, in which phases, and which tasks decide that the job is done.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import shlex
import string
from typing import Mapping

from tfctl.cluster.control import Phase
from tfctl.config.devices import DeviceAsk, DeviceError, HostDevices, Placement, enough_for, place
from tfctl.config.model import ClusterConfig, ContainerSettings
from tfctl.config.tracking import CHIEF_ENV
from tfctl.runs.record import RestartSpec, TaskSpec
from tfctl.supervisor.protocol import ClaimAsk, ContainerLaunch
from tfctl.transport.base import shell_path

# Jobs whose tasks run a tf.train.Server / tf.distribute.Server and so listen on their port.
# The evaluator of TF's sidecar evaluation is no server and is not part of the training cluster.
SERVER_JOBS = ("chief", "ps", "worker")
# Jobs that must keep running for the job to make progress: their end before completion is fatal.
ESSENTIAL_JOBS = ("ps",)
# How long the other workers wait for the chief's server before starting anyway.
LEAD_WAIT = 15.0
# The placeholders with one value for the whole run, whatever the task.
RUN_PLACEHOLDERS = ("ps_hosts", "worker_hosts", "chief_hosts", "evaluator_hosts", "run_id", "logdir")
DEFAULT_ENV = {
    # A Python task writing to a file buffers 8 KB at a time; logs must arrive as they are printed.
    "PYTHONUNBUFFERED": "1",
}
# TF's gRPC channels retry a peer that refused them after gRPC's initial backoff, 1 s (TF caps the
# backoff at 1 s). With every task started at once, a task often asks a peer whose server is not
# up yet, and then waits a second whatever the peer's delay: time to the first step was bimodal,
# ~1 s apart. 100 ms, growing 1.6x to TF's 1 s cap, finds the peer within a fraction of that.
GRPC_OPTIONS = "TF_GRPC_DEFAULT_OPTIONS"
FAST_RECONNECT = ("grpc.initial_reconnect_backoff_ms", "100")


def task_env(own: Mapping[str, str]) -> dict[str, str]:
    """tfctl's defaults under the cluster file's env for a task (TF_CONFIG aside).

    The fast reconnect joins any gRPC options the file sets, unless it sets that option itself.
    """
    env = {**DEFAULT_ENV, **own}
    options = [o for o in env.get(GRPC_OPTIONS, "").split(",") if o.strip()]
    if FAST_RECONNECT[0] not in (o.split("=", 1)[0].strip() for o in options):
        env[GRPC_OPTIONS] = ",".join([*options, "=".join(FAST_RECONNECT)])
    return env


def cluster_spec(config: ClusterConfig) -> dict[str, list[str]]:
    """The `cluster` part of TF_CONFIG: every server job, task index = position."""
    return {job: [str(a) for a in config.jobs[job].addresses] for job in config.jobs if job in SERVER_JOBS}


def tf_config(config: ClusterConfig, job: str, index: int) -> str:
    """TF_CONFIG exactly as tf.distribute's TFConfigClusterResolver reads it."""
    return json.dumps({"cluster": cluster_spec(config), "task": {"type": job, "index": index}}, separators=(",", ":"))


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
        "logdir": config.logdir_for(run_id) or "",
    }


def render_command(template: str, values: dict[str, str]) -> str:
    """Fill placeholders, each value shell-quoted (an empty host list becomes '')."""
    out = []
    for literal, field_name, _spec, _conv in string.Formatter().parse(template):
        out.append(literal)
        if field_name in ("python", "logdir"):
            out.append(shell_path(values[field_name]))  # `~/venv/bin/python` expands on the host
        elif field_name is not None:
            out.append(shlex.quote(values[field_name]))
    return "".join(out)


def render_env(env: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """Fill the placeholders of env values as they are: no shell reads them, so no quoting."""

    def fill(text: str) -> str:
        parts = string.Formatter().parse(text)
        return "".join(literal + (values[name] if name is not None else "") for literal, name, _, _ in parts)

    return {name: fill(text) for name, text in env.items()}


def setup_env(config: ClusterConfig, run_id: str) -> dict[str, str]:
    """The tasks' environment as `setup` gets it, less what only a task has (TF_CONFIG, devices):
    setup runs once per host, as no task, so a variable that needs a task's placeholder
    (`{task_index}`, `{gpus}`, `{python}`...) is left out; the run's own ones are filled in."""
    values = {k: v for k, v in placeholder_values(config, "", 0, "", run_id).items() if k in RUN_PLACEHOLDERS}
    usable = {
        name: text
        for name, text in config.env.items()
        if {field for _, field, _, _ in string.Formatter().parse(text) if field is not None} <= set(values)
    }
    return {**DEFAULT_ENV, **render_env(usable, values)}


def device_env(placed: Placement) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a task placed on GPUs (empty: it sees none), with indices counted
    as nvidia-smi counts them, not fastest GPU first as CUDA would."""
    if placed.gpus is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, placed.gpus)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def plan_tasks(
    config: ClusterConfig,
    run_id: str,
    python_for: dict[str, str],
    cwd_for: dict[str, str],
    devices: Mapping[str, HostDevices] | None = None,
    tracker_env: Mapping[str, str] | None = None,
) -> list[TaskSpec]:
    """Every task of the cluster with its rendered command and environment, and its devices.

    `python_for` and `cwd_for` map host -> interpreter and working directory on that host;
    `devices` what each host has (from preflight), else just what its tasks ask for;
    `tracker_env` what every task is told of its tracker runs (with `tracking:` on, each task is
    also told whether it is the chief, the one that logs). Raises DeviceError when tasks ask a
    host for more than it has.
    """
    asks = config.device_asks()
    if config.claims:
        asks, devices = claimed_devices(config, asks, devices)
    placement = place(asks, devices if devices is not None else enough_for(asks))
    chief = chief_task(config)
    tasks = []
    for job, index, address in config.tasks():
        placed = placement[f"{job}:{index}"]
        box = container_launch(config.container_for(job))
        python = python_for[address.host] if box is None else box.python
        values = placeholder_values(config, job, index, python, run_id)
        own = render_env(config.env_for(job), {**values, "gpus": ",".join(map(str, placed.gpus or ()))})
        if config.tracking is not None:
            own.update({**(tracker_env or {}), CHIEF_ENV: "1" if f"{job}:{index}" == chief else "0"})
        tasks.append(
            TaskSpec(
                job=job,
                index=index,
                host=address.host,
                port=address.port,
                command=render_command(config.command_for(job), values),
                env={**task_env({**device_env(placed), **own}), "TF_CONFIG": tf_config(config, job, index)},
                cwd=cwd_for[address.host],
                restart=restart_of(config, job),
                gpus=placed.gpus,
                cpus=placed.cpus,
                container=box,
                claims=claim_of(config, f"{job}:{index}"),
            )
        )
    return tasks


def claimed_devices(
    config: ClusterConfig, asks: list[DeviceAsk], devices: Mapping[str, HostDevices] | None
) -> tuple[list[DeviceAsk], dict[str, HostDevices]]:
    """A pool's run: each host offers exactly the GPUs its tasks claim, in task order, so each
    task is handed its own; a task that claims none sees none (another run's may be there). Cores
    counted by the pool are the claims' to pick on the host, not placed here."""
    gpus: dict[str, list[int]] = {}
    cores: dict[str, int] = {}
    mine = []
    for ask in asks:
        claim = config.claims[ask.task]
        gpus.setdefault(ask.host, []).extend(claim.gpus)
        cores[ask.host] = max(cores.get(ask.host, 0), claim.cpu_limit)
        mine.append(dataclasses.replace(ask, gpus=len(claim.gpus), cpus=None if claim.cpu_limit else ask.cpus))
    found = devices or {}
    for host, have in found.items():
        _check_pool_counts(f"pool {config.pool}", host, gpus.get(host, []), cores.get(host, 0), have)
    return mine, {h: HostDevices(tuple(g), found[h].cpus if h in found else ()) for h, g in gpus.items()}


def _check_pool_counts(pool: str, host: str, claimed: list[int], cores: int, have: HostDevices) -> None:
    """The pool file's word against the host's own (preflight): a GPU it does not have, or more
    cores than its tasks may run on, would fail the tasks at start."""
    missing = sorted(set(claimed) - set(have.gpus))
    if missing:
        why = f" ({have.gpu_error})" if have.gpu_error else f"; it has {', '.join(map(str, have.gpus)) or 'none'}"
        raise DeviceError(
            f"{host} has no GPU {', '.join(map(str, missing))}{why}, but {pool} hands it out",
            hint=f"correct `gpus` of {host} in the pool file",
        )
    if cores > len(have.cpus):
        raise DeviceError(
            f"{pool} counts {cores} cores on {host}, which lets tasks run on {len(have.cpus)}",
            hint=f"set `cpus: {len(have.cpus)}` (or less) for {host} in the pool file",
        )


def claim_of(config: ClusterConfig, task: str) -> ClaimAsk | None:
    claim = config.claims.get(task)
    if claim is None:
        return None
    return ClaimAsk(list(claim.gpus), claim.cpus, claim.cpu_limit, claim.task_limit)


def containers_by_host(config: ClusterConfig) -> dict[str, ContainerLaunch]:
    """host -> the container its tasks run in (of a host with several, the first task's), for preflight."""
    found: dict[str, ContainerLaunch] = {}
    for job, _, address in config.tasks():
        box = container_launch(config.container_for(job))
        if box is not None:
            found.setdefault(address.host, box)
    return found


def container_launch(box: ContainerSettings | None) -> ContainerLaunch | None:
    """The container a job's tasks run in, as their host's supervisor takes it; `{python}` is
    the image's python3 unless `python` names another."""
    if box is None:
        return None
    return ContainerLaunch(
        box.image, box.runtime, list(box.mounts), list(box.options), box.python or "python3", box.pull_timeout
    )


def restart_of(config: ClusterConfig, job: str) -> RestartSpec | None:
    """The job's restart policy as a task keeps it, or None when its tasks never restart."""
    policy = config.jobs[job].restart
    if policy is None or policy.policy == "never":
        return None
    return RestartSpec(policy.policy, policy.max_restarts, policy.backoff)


def start_phases(tasks: list[TaskSpec], order: str) -> list[Phase]:
    """How tasks start: `together`, every task at once as a hand launch does, then tfctl waits
    for the ps (without ps: the workers) to listen and checks every host reaches them; or
    `ordered`, the start order meant to avoid TF's waits.

    With parameter servers: ps and evaluator first, and every other host must reach each ps
    before going on; then, when worker 0 is the chief (TF1 between-graph), worker 0 until it
    listens, so the others find initialised variables instead of sleeping 30 s in "Waiting for
    model to be ready", then the remaining workers; with a chief job, chief and workers together.
    Without ps (all-reduce): all workers at once, as collectives need, and then every worker host
    must reach every worker.
    """
    if order == "together":
        # The same checks as the ordered start (the ps, or without ps every worker, must listen
        # and be reached from every host), made while everything is already starting.
        servers = [t.name for t in tasks if t.job == "ps"] or [t.name for t in tasks if listens(t)]
        return [Phase(tuple(tasks), tuple(servers), probe=True)] if tasks else []
    ps_first = tuple(t for t in tasks if t.job in ("ps", "evaluator"))
    rest = [t for t in tasks if t.job not in ("ps", "evaluator")]
    if not any(t.job == "ps" for t in tasks):
        phases = [Phase(ps_first)] if ps_first else []
        if rest:
            phases.append(Phase(tuple(rest), tuple(t.name for t in rest if listens(t)), probe=True))
        return phases
    phases = [Phase(ps_first, tuple(t.name for t in ps_first if listens(t)), probe=True)]
    if any(t.job == "chief" for t in rest):
        # A chief job means TF2's ParameterServerStrategy (or an Estimator-style chief): the chief
        # coordinates and waits for the workers itself, so holding them back only costs time.
        return phases + [Phase(tuple(rest))] if rest else phases
    lead = [t for t in rest if t.job == "worker" and t.index == 0]
    if lead:
        phases.append(Phase(tuple(lead), tuple(t.name for t in lead), wait_limit=LEAD_WAIT))
    others = tuple(t for t in rest if t not in lead)
    if others:
        phases.append(Phase(others))
    return phases


def chief_task(config: ClusterConfig) -> str:
    """The task TF makes the chief: `chief:0`, else worker 0 (the one that saves, and logs)."""
    return "chief:0" if "chief" in config.jobs else "worker:0"


def decisive_tasks(config: ClusterConfig) -> list[str]:
    """Tasks whose success means the job is done: the chief (or worker 0), or all workers."""
    if config.success_policy == "all_workers":
        names = [f"worker:{i}" for i in range(len(config.jobs["worker"].addresses))] if "worker" in config.jobs else []
        return (["chief:0"] if "chief" in config.jobs else []) + names
    return [chief_task(config)]


def essential_tasks(tasks: list[TaskSpec]) -> list[str]:
    return [t.name for t in tasks if t.job in ESSENTIAL_JOBS]


def listens(task: TaskSpec) -> bool:
    return task.job in SERVER_JOBS


def exposed_addresses(config: ClusterConfig, hosts_file: str = "/etc/hosts") -> list[str]:
    """Task addresses that are public IPs: TF servers are unauthenticated and bind every
    interface, so anyone who reaches such an address can run code in the cluster.

    IP literals are checked as written and names through /etc/hosts only (no DNS at start-up).
    """
    known: dict[str, str] = {}
    try:
        with open(hosts_file) as f:
            for line in f:
                fields = line.split("#", 1)[0].split()
                for name in fields[1:]:
                    known.setdefault(name, fields[0])
    except OSError:
        pass
    exposed = []
    for _job, _index, address in config.tasks():
        try:
            ip = ipaddress.ip_address(known.get(address.host, address.host))
        except ValueError:
            continue
        if ip.is_global:
            exposed.append(f"{address} ({ip})" if str(ip) != address.host else str(address))
    return exposed
