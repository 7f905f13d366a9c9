"""From a validated cluster file to a run: task specs, hosts, start phases, completion rules.

A run is drafted first (`draft`: its id, the hosts its backend acquired, how each is reached, its
settings), then planned once (`make_plan`): on the devices preflight found on the hosts for a
real run, or on just what the tasks ask for to show a plan (`up --dry-run`, `check`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from tfctl.backends.base import backend_for
from tfctl.cluster.agent import REMOTE_ROOT, interpreter
from tfctl.cluster.control import Phase
from tfctl.config.devices import HostDevices
from tfctl.config.model import ClusterConfig
from tfctl.controller.start.setup_commands import Setup, plan_setup
from tfctl.runs.record import HostSpec, Placement, ProgressSpec, RunRecord
from tfctl.runs.store import RunStore
from tfctl.tf import tasks as tf_cluster
from tfctl.tracking import registry


@dataclass(frozen=True)
class Draft:
    """A run before its tasks are planned: the cluster as its backend placed it, and the run's
    record with its hosts and settings but no tasks yet (what `up` records first)."""

    config: ClusterConfig
    record: RunRecord


@dataclass(frozen=True)
class Plan:
    config: ClusterConfig
    record: RunRecord
    phases: tuple[Phase, ...]
    startup_timeout: float
    sync_dir: Path | None = None  # copied to remote hosts before start, when set
    exclude: tuple[str, ...] = ()
    setup: Setup | None = None  # run on every host after sync, before any task


def remote_workdir(run_id: str) -> str:
    """Where a synced copy of the workdir lives on a remote host for one run."""
    return f"{REMOTE_ROOT}/work/{run_id}"


def host_specs(config: ClusterConfig, state: Mapping[str, Any] | None = None) -> tuple[HostSpec, ...]:
    """How to reach each host of the cluster, as its backend reaches it (`state`: what the backend
    acquired for the run); its spares last, checked, synced and set up as every host is, so that
    taking over a lost host's tasks is only starting them."""
    backend = backend_for(config.backend)
    hosts = sorted({a.host for _, _, a in config.tasks()}) + list(backend.spares(config))
    return tuple(backend.host_spec(config, h, state) for h in hosts)


def local_workdir(config: ClusterConfig) -> str:
    return str(config.workdir or config.path.resolve().parent)


def _python_and_cwd(
    config: ClusterConfig, run_id: str, hosts: tuple[HostSpec, ...]
) -> tuple[dict[str, str], dict[str, str]]:
    """host -> the tasks' interpreter, and host -> the directory they run in."""
    python_for = {h.name: interpreter(h.python, h.shares_files) for h in hosts}
    local_dir = local_workdir(config)
    # Remote tasks run in the synced copy, or in the same path when the filesystem is shared.
    cwd_for = {h.name: local_dir if h.shares_files or not config.sync else remote_workdir(run_id) for h in hosts}
    return python_for, cwd_for


def draft(config: ClusterConfig, run_id: str, state: Mapping[str, Any] | None = None) -> Draft:
    """The run on the cluster's hosts, as its backend reaches them (`state`: what it acquired)."""
    record = RunRecord(
        run_id=run_id,
        cluster_name=config.name,
        cluster_file=str(config.path.resolve()),
        created_at=time.time(),
        tasks=(),
        hosts=host_specs(config, state),
        grace_period=config.grace_period,
        decisive=tuple(tf_cluster.decisive_tasks(config)),
        hang_timeout=config.hang_timeout or config.startup_timeout,
        startup_timeout=config.startup_timeout,
        lease_timeout=config.lease_timeout,
        idle_timeout=config.idle_ps_timeout,
        host_timeout=config.host_timeout,
        progress=ProgressSpec(
            config.progress.regex,
            config.progress.stall_timeout,
            config.progress.window,
            config.progress.on_stall,
            dict(config.metrics),
        ),
        logdir=config.logdir_for(run_id),
        backend=config.backend,
        backend_state=None if state is None else dict(state),
        notify=config.notify,
        spares=backend_for(config.backend).spares(config),
        params=dict(config.params),
        param_texts=dict(config.param_texts),
        sweep=None if config.trial is None else config.trial.sweep,
        trial=None if config.trial is None else config.trial.index,
        placement=placement_of(config),
    )
    return Draft(config, record)


def placement_of(config: ClusterConfig) -> tuple[Placement, ...]:
    """The placement a pool made, as the placed cluster names it (() for hosts the file lists)."""
    return tuple(
        Placement(task, job.addresses[index].host, claim.gpus, claim.cpus)
        for name, job in config.jobs.items()
        for index in range(len(job.addresses))
        for task in [f"{name}:{index}"]
        for claim in [config.claims.get(task)]
        if claim is not None
    )


def make_plan(draft: Draft, devices: Mapping[str, HostDevices] | None = None) -> Plan:
    """The run planned, once: every task with its command, environment and devices (placed on
    what each host has, as preflight found it; None: on just what the tasks ask for), the start
    phases, sync and setup. Raises DeviceError when tasks ask a host for more than it has."""
    config, record = draft.config, draft.record
    python_for, cwd_for = _python_and_cwd(config, record.run_id, record.hosts)
    tracker_env = registry.task_env(record.tracking)
    tasks = tf_cluster.plan_tasks(config, record.run_id, python_for, cwd_for, devices, tracker_env)
    record = record.replace(
        tasks=tuple(tasks),
        essential=tuple(tf_cluster.essential_tasks(tasks)) if config.fail_on_ps_exit else (),
    )
    remote = not all(h.shares_files for h in record.hosts)
    setup = None
    if config.setup:
        hosts = [h.name for h in record.hosts]
        setup = plan_setup(config.setup, hosts, cwd_for, tf_cluster.setup_env(config, record.run_id))
    return Plan(
        config,
        record,
        tuple(tf_cluster.start_phases(tasks, config.start_order)),
        config.startup_timeout,
        Path(local_workdir(config)) if remote and config.sync else None,
        config.exclude,
        setup,
    )


def drafted(config: ClusterConfig, store: RunStore, run_id: str, state: Mapping[str, Any] | None) -> Draft:
    """`draft`, the record naming the store it is kept in (`down --all` reaps only its own orphans)."""
    run = draft(config, run_id, state)
    return replace(run, record=run.record.replace(store=store.store_id))
