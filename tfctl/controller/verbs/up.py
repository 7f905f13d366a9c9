"""`tfctl up` before the start: refuse a second live run of the file, plan the run (what
`--dry-run` shows and `check` checks), acquire its hosts, find the run it resumes, and warn of
what the cluster file exposes. The start itself is the live controller's (`live/launch.py`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Mapping

from tfctl.backends.base import backend_for
from tfctl.cluster.cluster import Cluster, Progress
from tfctl.config.model import ClusterConfig
from tfctl.controller.live.watcher import controller_gone
from tfctl.controller.start.plan import Draft, Plan, drafted, make_plan
from tfctl.errors import UsageError
from tfctl.runs.store import RunStore, new_run_id
from tfctl.supervisor.protocol import RunState
from tfctl.tf.tasks import exposed_addresses
from tfctl.trace import traced

if TYPE_CHECKING:
    pass

# A run recorded as starting with no controller yet is an `up -d` about to fork its watcher, for
# this long; after that, one whose `up -d` died in between.
CLAIM_PATIENCE = 60.0


@traced("lifecycle.ensure_no_live_run")
def ensure_no_live_run(store: RunStore, config: ClusterConfig) -> str | None:
    """Refuse a second live run of the same cluster: the ports and the tasks would collide. The
    id of the newest run it found over, for `transitions.claim` to know (None: there was none).
    Runs submitted to a queue do not count: their pool places them apart, their ports chosen."""
    trial = config.trial
    record = store.latest(config.path, (None, None) if trial is None else (trial.sweep, trial.index), queued_too=False)
    if record is None:
        return None
    if not record.active and record.left_nothing:
        return record.run_id  # its stop proved nothing of it left on any host: no need to ask them again
    if backend_for(record.backend).is_over(record):
        return record.run_id
    controller = record.watcher
    just_claimed = controller is None and time.time() - record.created_at < CLAIM_PATIENCE  # `up -d` forks next
    if record.state is RunState.STARTING and (just_claimed or controller is not None and not controller_gone(record)):
        raise UsageError(
            f"run {record.run_id} of cluster {config.name!r} is starting (syncing, setup or starting tasks; "
            + (
                "its `tfctl up -d` is forking its watcher"
                if controller is None
                else f"{'its `tfctl up`' if controller.attached else 'its watcher'} is pid {controller.pid}"
            )
            + ")",
            hint=f"wait for it, or stop it (Ctrl-C in its terminal, or tfctl -f {config.path} down)",
        )
    with Cluster(record) as cluster:
        statuses, _ = cluster.status()
    alive = [s for s in statuses if s.state.may_be_alive]
    if alive:
        raise UsageError(
            f"run {record.run_id} of cluster {config.name!r} is still running ({len(alive)} tasks: "
            f"{', '.join(s.task for s in alive)})",
            hint=f"stop it first: tfctl -f {config.path} down --run {record.run_id}",
        )
    return record.run_id


def plan_run(
    config: ClusterConfig, store: RunStore, run_id: str | None = None, state: Mapping[str, Any] | None = None
) -> Plan:
    """The run as it would start on hosts with the devices its tasks ask for, acquiring nothing
    and asking no host: what `--dry-run` shows and `check` checks."""
    return make_plan(drafted(config, store, run_id or new_run_id(config.name), state))


def acquire(store: RunStore, config: ClusterConfig, progress: Progress, resumes: str | None = None) -> Draft:
    """A run on the hosts its backend acquired for it (an allocation a scheduler granted; over
    ssh, the file's hosts as they are), drafted: `launch` plans it once it knows their devices.
    `resumes`: the earlier run whose files it continues from (`resumed_run`)."""
    run_id = new_run_id(config.name)
    acquired = backend_for(config.backend).acquire(config, run_id, progress)
    run = drafted(acquired.config, store, run_id, acquired.state)
    return dataclasses.replace(run, record=run.record.replace(resumes=resumes, resubmits=acquired.resubmits))


def resumed_run(store: RunStore, config: ClusterConfig, wanted: str) -> str:
    """The run `up --resume` continues: `wanted`, else the cluster file's newest run. Only a
    run of the same cluster file: its tasks are the ones whose files the new tasks find."""
    if wanted:
        record = store.load(wanted)
    else:
        latest = store.latest(config.path)
        if latest is None:
            raise UsageError(
                f"no earlier run of {config.path} to resume", hint=f"start one with `tfctl -f {config.path} up`"
            )
        record = latest
    if record.cluster_file != str(config.path.resolve()):
        raise UsageError(
            f"run {record.run_id} is a run of {record.cluster_file}, not of {config.path}",
            hint=f"resume it with `tfctl -f {record.cluster_file} up --resume {record.run_id}`",
        )
    if record.active:
        raise UsageError(
            f"run {record.run_id} is still {record.state}",
            hint=f"stop it first: tfctl -f {config.path} down --run {record.run_id}",
        )
    return record.run_id


def security_warnings(config: ClusterConfig) -> list[str]:
    exposed = exposed_addresses(config)
    if not exposed:
        return []
    return [
        f"TF servers are unauthenticated and listen on all interfaces; these task addresses are public: "
        f"{', '.join(exposed)}. Anyone who can reach them can run code on your hosts: keep the cluster on a "
        "private network or firewall the ports to the cluster's hosts."
    ]
