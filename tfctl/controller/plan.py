"""From a validated cluster file to a run: task specs, hosts, start phases, completion rules."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tfctl import backends
from tfctl.cluster.agent import REMOTE_ROOT, interpreter
from tfctl.cluster.control import Phase
from tfctl.config.devices import HostDevices
from tfctl.config.model import ClusterConfig
from tfctl.controller.setup_commands import Setup, plan_setup
from tfctl.runs.record import HostSpec, ProgressSpec, RunRecord
from tfctl.tf import tasks as tf_cluster


@dataclass(frozen=True)
class Plan:
    config: ClusterConfig  # what the plan was made from; devices are placed from it again (`with_devices`)
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
    acquired for the run)."""
    backend = backends.get(config.backend)
    return tuple(backend.host_spec(config, h, state) for h in sorted({a.host for _, _, a in config.tasks()}))


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


def make_plan(config: ClusterConfig, run_id: str, state: Mapping[str, Any] | None = None) -> Plan:
    """The run as it would start on hosts with the devices its tasks ask for (`with_devices`
    places them on what the hosts have); `state`: what the backend acquired for it."""
    hosts = host_specs(config, state)
    python_for, cwd_for = _python_and_cwd(config, run_id, hosts)
    tasks = tf_cluster.plan_tasks(config, run_id, python_for, cwd_for)
    record = RunRecord(
        run_id=run_id,
        cluster_name=config.name,
        cluster_file=str(config.path.resolve()),
        created_at=time.time(),
        tasks=tuple(tasks),
        hosts=hosts,
        grace_period=config.grace_period,
        decisive=tuple(tf_cluster.decisive_tasks(config)),
        essential=tuple(tf_cluster.essential_tasks(tasks)) if config.fail_on_ps_exit else (),
        hang_timeout=config.hang_timeout or config.startup_timeout,
        startup_timeout=config.startup_timeout,
        lease_timeout=config.lease_timeout,
        idle_timeout=config.idle_ps_timeout,
        host_timeout=config.host_timeout,
        progress=ProgressSpec(config.progress.regex, config.progress.stall_timeout, config.progress.window),
        logdir=config.logdir_for(run_id),
        backend=config.backend,
        backend_state=None if state is None else dict(state),
    )
    remote = not all(h.shares_files for h in hosts)
    setup = None
    if config.setup:
        setup = plan_setup(config.setup, [h.name for h in hosts], cwd_for, tf_cluster.setup_env(config, run_id))
    return Plan(
        config,
        record,
        tuple(tf_cluster.start_phases(tasks, config.start_order)),
        config.startup_timeout,
        Path(local_workdir(config)) if remote and config.sync else None,
        config.exclude,
        setup,
    )


def with_devices(plan: Plan, devices: Mapping[str, HostDevices]) -> Plan:
    """The plan with every task placed on the GPUs and cores its host has, as preflight found
    them. Raises DeviceError when tasks ask a host for more than it has."""
    record = plan.record
    python_for, cwd_for = _python_and_cwd(plan.config, record.run_id, record.hosts)
    tasks = tf_cluster.plan_tasks(plan.config, record.run_id, python_for, cwd_for, devices)
    return dataclasses.replace(
        plan,
        record=record.replace(tasks=tuple(tasks)),
        phases=tuple(tf_cluster.start_phases(tasks, plan.config.start_order)),
    )
