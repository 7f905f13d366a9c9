"""From a validated cluster file to a run: task specs, hosts, start phases, completion rules."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tfctl.config import ClusterConfig
from tfctl.hostagent import REMOTE_ROOT, interpreter
from tfctl.orchestrator import Phase
from tfctl.runs import HostSpec, RunRecord, tfctl_home
from tfctl.tf import cluster as tf_cluster
from tfctl.transport import is_local_name


@dataclass(frozen=True)
class Plan:
    record: RunRecord
    phases: tuple[Phase, ...]
    startup_timeout: float


def host_spec(config: ClusterConfig, host: str) -> HostSpec:
    if is_local_name(host):
        return HostSpec(host, config.python, str(tfctl_home()), {"kind": "local"})
    return HostSpec(host, config.python, REMOTE_ROOT, {"kind": "ssh"})


def host_specs(config: ClusterConfig) -> tuple[HostSpec, ...]:
    return tuple(host_spec(config, h) for h in sorted({a.host for _, _, a in config.tasks()}))


def make_plan(config: ClusterConfig, run_id: str) -> Plan:
    hosts = host_specs(config)
    python_for = {h.name: interpreter(h.python, h.transport["kind"] == "local") for h in hosts}
    tasks = tf_cluster.plan_tasks(config, run_id, python_for)
    record = RunRecord(
        run_id=run_id, cluster_name=config.name, cluster_file=str(config.path.resolve()), created_at=time.time(),
        tasks=tuple(tasks), hosts=hosts, grace_period=config.grace_period,
        decisive=tuple(tf_cluster.decisive_tasks(config)), essential=tuple(tf_cluster.essential_tasks(tasks)),
    )
    return Plan(record, tuple(tf_cluster.start_phases(tasks)), config.startup_timeout)
