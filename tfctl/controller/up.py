"""`tfctl up`: from a planned run to started tasks: refuse a second live run, preflight every
host, place devices, record the run, sync the workdir, run `setup`, start the tasks phase by phase.

What only a started run needs (log following, the door, the doctor) is imported where it is
used: `up -d` forks as soon as the run is planned, and none of it should load before the tasks.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping

from tfctl import backends
from tfctl.cluster import control
from tfctl.cluster.supervisors import Cluster, HostInfo, Progress
from tfctl.config.devices import gpu_hosts
from tfctl.config.model import ClusterConfig
from tfctl.controller.down import release
from tfctl.controller.plan import Plan, make_plan, remote_workdir, with_devices
from tfctl.controller.setup_commands import once_per_workdir, run_setup
from tfctl.controller.watcher import controller_gone, controller_of_this_process
from tfctl.controller.workdir_sync import apply_host, build_manifest, one_per_filesystem, plan_host
from tfctl.errors import StartupError, TfctlError, UsageError
from tfctl.runs.record import Controller, ControllerKind
from tfctl.runs.store import RunStore, new_run_id
from tfctl.supervisor.protocol import RunState
from tfctl.tf.tasks import exposed_addresses
from tfctl.trace import traced

if TYPE_CHECKING:
    pass

LOG_DRAIN_SECONDS = 10.0


@traced("lifecycle.ensure_no_live_run")
def ensure_no_live_run(store: RunStore, config: ClusterConfig) -> None:
    """Refuse a second live run of the same cluster: the ports and the tasks would collide."""
    record = store.latest(config.path)
    if record is None or (not record.active and record.left_nothing):
        return  # its stop proved nothing of it left on any host: no need to ask them again
    if backends.get(record.backend).is_over(record):
        return
    controller = record.watcher
    if record.state is RunState.STARTING and controller is not None and not controller_gone(record):
        raise UsageError(
            f"run {record.run_id} of cluster {config.name!r} is starting (syncing, setup or starting tasks; "
            f"{'its `tfctl up`' if controller.attached else 'its watcher'} is pid {controller.pid})",
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


def plan_run(
    config: ClusterConfig, store: RunStore, run_id: str | None = None, state: Mapping[str, Any] | None = None
) -> Plan:
    """The run as it would start, acquiring nothing: for `--dry-run`, `check`, and runs whose
    backend has nothing to acquire (`state`: what it acquired, when it did)."""
    plan = make_plan(config, run_id or new_run_id(config.name), state)
    return dataclasses.replace(plan, record=plan.record.replace(store=store.store_id))


def acquire(store: RunStore, config: ClusterConfig, progress: Progress) -> Plan:
    """The plan of a run on the hosts its backend acquired for it (an allocation a scheduler
    granted; over ssh, the file's hosts as they are)."""
    run_id = new_run_id(config.name)
    acquired = backends.get(config.backend).acquire(config, run_id, progress)
    return plan_run(acquired.config, store, run_id, acquired.state)


def security_warnings(config: ClusterConfig) -> list[str]:
    exposed = exposed_addresses(config)
    if not exposed:
        return []
    return [
        f"TF servers are unauthenticated and listen on all interfaces; these task addresses are public: "
        f"{', '.join(exposed)}. Anyone who can reach them can run code on your hosts: keep the cluster on a "
        "private network or firewall the ports to the cluster's hosts."
    ]


def launch(
    store: RunStore,
    plan: Plan,
    progress: Progress,
    accept_new_host_keys: bool = False,
    detach: bool = False,
    watcher: Controller | None = None,
) -> Cluster:
    """Preflight every host, place the tasks on its GPUs and cores, check ports, record the run,
    sync code, run `setup`, and start the tasks phase by phase.

    Nothing is started anywhere until every host has answered; any failure after that stops
    whatever was started before the error is raised. The caller closes the returned cluster.
    An attached run (not `detach`) holds a lease on its hosts while the cluster is open, and
    records this process as its controller; a detached one records `watcher`, if given.
    """
    if detach:
        record = plan.record.replace(lease_timeout=0.0, watcher=watcher)
    else:
        record = plan.record.replace(watcher=controller_of_this_process(ControllerKind.UP))
    backend = backends.get(record.backend)
    launcher = backend.monitor_launcher(record)
    cluster = Cluster(record, accept_new_host_keys=accept_new_host_keys, holds_lease=not detach, launcher=launcher)
    try:
        infos = cluster.preflight(progress, set() if backend.places_devices else gpu_hosts(plan.config.device_asks()))
        for warning in version_warnings(infos):
            progress("warning", warning)
        if not backend.places_devices:
            plan = with_devices(plan, {i.host: i.devices for i in infos})
            record = cluster.record = record.replace(tasks=plan.record.tasks)
        busy = cluster.busy_ports(list(record.tasks))
        if busy:
            lines = [
                f"  {address}: in use by pid {', '.join(map(str, info.pids)) or '?'}"
                + (f" ({info.command})" if info.command else "")
                for address, info in busy.items()
            ]
            raise StartupError(
                "task ports already in use:\n" + "\n".join(lines),
                hint="stop what holds them (`tfctl down --all` if it is an old run), "
                "or change the ports in the cluster file",
            )
        with store.lock():
            store.create(record)  # first: whatever follows leaves files on the hosts, for `prune`
        try:
            if plan.sync_dir is not None:
                sync_code(cluster, plan, progress)
            if plan.setup is not None:
                setup, sharing = once_per_workdir(plan.setup, record.hosts, {i.host: i.filesystem for i in infos})
                for host, others in sorted(sharing.items()):
                    for other in others:
                        progress(other, f"shares its workdir with {host}: set up there, once")
                run_setup(cluster, setup, progress)
            control.start(cluster, plan.phases, plan.startup_timeout, progress)
        except KeyboardInterrupt:
            store.end(record.run_id, RunState.STOPPED, "interrupted during start")
            raise
        except TfctlError as e:
            store.end(record.run_id, RunState.FAILED, e.message.splitlines()[0])
            raise
    except BaseException:
        cluster.close()
        release(record)
        raise
    cluster.record = store.update(record.run_id, state=RunState.RUNNING)
    return cluster


def version_warnings(infos: list[HostInfo]) -> list[str]:
    """Hosts that would run the same script with different Python or TensorFlow versions."""
    warnings = []
    for what in ("python", "tensorflow"):
        seen = {getattr(i, what) or "none" for i in infos}
        if len(seen) > 1:
            detail = ", ".join(f"{i.host}: {getattr(i, what) or 'none'}" for i in infos)
            warnings.append(f"{what} differs across hosts ({detail})")
    for info in infos:
        if info.error:
            warnings.append(f"{info.host}: the configured python does not run: {info.error}")
    return warnings


def sync_code(cluster: Cluster, plan: Plan, progress: Progress) -> None:
    """Copy the workdir to every remote host's run directory, in parallel; hosts that share a home
    directory get it once."""
    assert plan.sync_dir is not None
    manifest = build_manifest(plan.sync_dir, plan.exclude)
    remote = [h.name for h in plan.record.hosts if not h.shares_files]
    dest = remote_workdir(plan.record.run_id)
    name = plan.record.cluster_name
    for host in remote:
        progress(host, f"syncing {plan.sync_dir} ({len(manifest.files)} files)")
    plans = cluster.fan_out(remote, lambda a: plan_host(a, manifest, name))
    plans.raise_if_failed("syncing the workdir")
    groups = one_per_filesystem(plans.succeeded)
    result = cluster.fan_out(groups, lambda a: apply_host(a, manifest, name, dest, plans.succeeded[a.host].need))
    result.raise_if_failed("syncing the workdir")
    for host, answer in sorted(result.succeeded.items()):
        progress(host, f"synced: {answer.copied} of {answer.files} files changed, now in {dest}")
        for other in groups[host]:
            progress(other, f"shares its home directory with {host}: the same copy, synced once")
