"""A planned run's start on its hosts: preflight every host, place devices, sync the workdir,
run `setup`, start the tasks phase by phase (`cluster.control.start`); and the same run started
again on the hosts of a new allocation or after a move.

The live controller's: the attached `up`, the detached watcher and the controller of a new
allocation start runs through here, and `tfctl up` (`verbs/up.py`) plans them first.
"""

from __future__ import annotations

import time
from importlib import metadata
from typing import Mapping

from tfctl.backends.base import backend_for
from tfctl.cluster import control
from tfctl.cluster.answers import HostInfo
from tfctl.cluster.cluster import Cluster, Progress
from tfctl.config.devices import gpu_hosts
from tfctl.config.model import ClusterConfig
from tfctl.controller.live.notify import Notifier
from tfctl.controller.live.stopping import release
from tfctl.controller.live.tracked import close_trackers, open_trackers
from tfctl.controller.live.watcher import controller_of_this_process
from tfctl.controller.start.plan import Draft, Plan, make_plan, remote_workdir
from tfctl.controller.start.preflight import preflight, tensorboard_warnings
from tfctl.controller.start.setup_commands import once_per_workdir, run_setup
from tfctl.controller.start.workdir_sync import apply_host, build_manifest, one_per_filesystem, plan_host
from tfctl.engine.reconcile import Notify
from tfctl.engine.verdicts import Outcome
from tfctl.errors import StartupError, TfctlError
from tfctl.runs import transitions
from tfctl.runs.record import Controller, ControllerKind, RunRecord
from tfctl.runs.store import RunStore
from tfctl.runs.transitions import take_control
from tfctl.supervisor.protocol import ReapRequest, ResumeRequest, RunState
from tfctl.tf.tasks import containers_by_host

# How long picked ports are held at most if `up` dies before it frees them (a `down` frees them
# at once: the holders carry the run's marker); a sync and setup longer than this lose the hold.
PICKED_PORTS_HOLD = 900.0


def remove_leftover_containers(
    store: RunStore, cluster: Cluster, hosts: list[str], grace: float, progress: Progress
) -> None:
    """Remove, on the hosts whose tasks run in containers, what containers runs of this store
    that are not active left there (a crashed tfctl's), by their labels; say so in one line."""
    if not hosts:
        return
    live = sorted({cluster.record.run_id, *(r.run_id for r in store.all() if r.active)})
    answers = cluster.fan_out(hosts, lambda a: a.call(ReapRequest(live, grace, store.store_id, containers_only=True)))
    found = {host: answer for host, answer in sorted(answers.succeeded.items()) if answer.containers}
    if found:
        count = sum(answer.containers for answer in found.values())
        runs = sorted({run for answer in found.values() for run in answer.runs})
        progress(
            "",
            f"removed {count} container{'s' if count != 1 else ''} left by runs that are not active"
            f" ({', '.join(runs)}) on {', '.join(found)}",
        )


def busy_ports_hint(store: RunStore, starting: str, busy: Mapping[str, object]) -> str:
    """How to free task ports: a live run of another cluster file holding them is named with its
    own `down` (`down --all` would not stop it); else what `down --all` does stop, or no port."""
    holders = {t.address: r for r in store.all() if r.active and r.run_id != starting for t in r.tasks}
    runs = {holders[a].run_id: holders[a].cluster_file for a in busy if a in holders}
    if runs:
        return "they are run " + "; run ".join(
            f"{run_id}'s: stop it with `tfctl -f {path} down --run {run_id}`" for run_id, path in runs.items()
        )
    return (
        "stop what holds them (what a crashed run left: `tfctl down --all`), or write these hosts "
        "without a port (`localhost`, not `localhost:2222`): each run then gets free ones"
    )


def launch(
    store: RunStore,
    run: Draft,
    progress: Progress,
    accept_new_host_keys: bool = False,
    detach: bool = False,
    watcher: Controller | None = None,
    cleared: str | None = None,
) -> Cluster:
    """Record the run (`transitions.claim`, unless `up -d` did before it forked), preflight every host, place
    the tasks on its GPUs and cores, check ports, sync code, run `setup`, and start the tasks
    phase by phase.

    Nothing is started anywhere until every host has answered; any failure after that stops
    whatever was started before the error is raised, and a `down` typed meanwhile stops the
    start. The caller closes the returned cluster. An attached run (not `detach`) holds a lease
    on its hosts while the cluster is open, and records this process as its controller; a
    detached one records `watcher`, if given.
    """
    if detach:
        record = run.record.replace(lease_timeout=0.0, watcher=watcher)
    else:
        record = run.record.replace(watcher=controller_of_this_process(ControllerKind.UP))
    if not store.exists(record.run_id):
        transitions.claim(store, record, cleared)
    elif transitions.apply(store, record.run_id, take_control(record.watcher, record.lease_timeout)) is None:
        raise StartupError(f"run {record.run_id} was stopped (tfctl down) before it started")
    transitions.keep_cluster_file(store, record.run_id, run.config.source)
    backend = backend_for(record.backend)
    launcher = backend.monitor_launcher(record)
    cluster = Cluster(record, accept_new_host_keys=accept_new_host_keys, holds_lease=not detach, launcher=launcher)
    try:
        _start(store, cluster, run.config, progress)
    except BaseException as e:
        cluster.close()
        release(record)
        _tell_failed_start(store, record, e)
        raise
    cluster.apply(store, transitions.mark_running())
    return cluster


def start_again(store: RunStore, cluster: Cluster, run: Draft, progress: Progress) -> None:
    """The same run started again on the hosts of a new allocation (`run`, drafted on them and
    recorded): `cluster` moves onto them, and the tasks start as in `launch`, finding their files
    (checkpoints) in the run's own directory. The earlier run it resumed is not brought in again:
    that would overwrite what this run saved since."""
    backend = backend_for(run.record.backend)
    record = run.record.replace(resumes=None)
    cluster.rehost(record, backend.monitor_launcher(record))
    _start(store, cluster, run.config, progress, touched=True, again=f"allocation{len(record.allocations)}")
    cluster.apply(store, transitions.mark_running())


def _start(
    store: RunStore, cluster: Cluster, config: ClusterConfig, progress: Progress, touched: bool = False, again: str = ""
) -> None:
    """Everything of `launch` after the run is recorded; its end recorded if it fails (unless a
    `down` ended it first: that said why). A run that fails before anything was put on a host
    (preflight, devices, busy ports) is forgotten: there is nothing of it to stop or prune.
    `touched`: something of the run was put on hosts before (an earlier allocation's), whose
    tasks' state each host sets aside under `again` (`StartRequest.again`)."""
    record = cluster.record
    backend = backend_for(record.backend)
    picked: dict[str, list[int]] = {}  # ports picked for tasks written without one, held until they start
    try:
        gpus = set() if backend.places_devices else gpu_hosts(config.device_asks())
        infos = preflight(cluster, config, progress, gpus)
        remove_leftover_containers(store, cluster, sorted(containers_by_host(config)), config.grace_period, progress)
        for warning in version_warnings(infos) + tensorboard_warnings(config, infos):
            progress("warning", warning)
        picked = pick_ports(cluster, config, progress)
        config = config.with_ports(picked)
        # Planned here: on the devices the hosts have (a backend that places devices itself gets
        # what the tasks ask for, and its scheduler hands them out); again once its trackers are known.
        devices = None if backend.places_devices else {i.host: i.devices for i in infos}
        plan = make_plan(Draft(config, record), devices)
        versions = {
            "tfctl": metadata.version("tfctl"),
            **{i.host: f"python {i.python or '?'}, {i.tensorflow or 'no tensorflow'}" for i in infos},
        }
        cluster.apply(store, transitions.record_plan(plan.record.tasks, plan.record.essential, versions))
        record = cluster.record
        busy = cluster.busy_ports([t for t in record.tasks if t.port not in picked.get(t.host, ())])
        if busy:
            lines = [
                f"  {address}: in use by pid {', '.join(map(str, info.pids)) or '?'}"
                + (f" ({info.command})" if info.command else "")
                for address, info in busy.items()
            ]
            hint = busy_ports_hint(store, record.run_id, busy)
            raise StartupError("task ports already in use:\n" + "\n".join(lines), hint=hint)
        touched = True
        if config.tracking is not None:  # once nothing can make the run forgotten; the tasks are told of them
            open_trackers(store, cluster, config, progress)
            plan = make_plan(Draft(config, cluster.record), devices)
            cluster.apply(store, transitions.record_plan(plan.record.tasks, plan.record.essential, versions))
            record = cluster.record
        if plan.sync_dir is not None:
            sync_code(cluster, plan, progress)
        if record.resumes:
            resume_files(cluster, record.resumes, {i.host: i.filesystem for i in infos}, progress)
        if plan.setup is not None:
            setup, sharing = once_per_workdir(plan.setup, record.hosts, {i.host: i.filesystem for i in infos})
            for host, others in sorted(sharing.items()):
                for other in others:
                    progress(other, f"shares its workdir with {host}: set up there, once")
            run_setup(cluster, setup, progress)
        if not store.load(record.run_id).active:
            raise StartupError(f"run {record.run_id} was stopped (tfctl down) while it started")
        if picked:
            cluster.free_picked_ports(list(picked))
            picked = {}
        control.start(cluster, plan.phases, plan.startup_timeout, progress, again)
    except KeyboardInterrupt:  # Ctrl-C, or a `down` (through its watcher): the record says so
        _end_if_active(store, record.run_id, RunState.STOPPED, "interrupted during start", True, progress)
        raise
    except TfctlError as e:
        touched = touched or record.priority is not None  # a queued run's id was given out at submit: kept
        _end_if_active(store, record.run_id, RunState.FAILED, e.message.splitlines()[0], touched, progress)
        if not touched:  # its id was printed as the start began, but `runs` will never show it
            e.message += f"\nrun {record.run_id} not kept: nothing was started"
        raise
    finally:
        if picked:  # the start failed before its tasks could take them
            cluster.free_picked_ports(list(picked))


def pick_ports(cluster: Cluster, config: ClusterConfig, progress: Progress) -> dict[str, list[int]]:
    """host -> the free ports its supervisor picked for its tasks written without a port (none
    when every task has one). Each is held by a listener until `free_picked_ports`, just before
    the tasks start; a port taken in the moment between that and the task binding it fails the
    task's start, which says the port is in use: `up` again picks others."""
    wanted = {host: (count, config.ports_written(host)) for host, count in config.ports_to_choose().items()}
    if not wanted:
        return {}
    picked = cluster.pick_ports(wanted, PICKED_PORTS_HOLD)
    for host, ports in sorted(picked.items()):
        progress(host, f"picked free port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))}")
    return picked


def _end_if_active(
    store: RunStore, run_id: str, state: RunState, reason: str, touched: bool, progress: Progress
) -> None:
    """The failed start recorded (a `down` ending it meanwhile keeps its own reason), its tracker
    runs told; forgotten if nothing of it was put on a host."""
    transitions.apply(store, run_id, transitions.end_if_active(state, reason, time.time()))
    close_trackers(store, run_id, lambda line: progress("warning", line))
    if not touched:
        transitions.forget(store, run_id)


def _tell_failed_start(store: RunStore, record: RunRecord, error: BaseException) -> None:
    """Send the end of a start that failed (or was interrupted, or stopped by a `down`) to the
    `notify:` commands, as recorded (a run forgotten, as it failed): an `up -d` whose ps exited
    before listening reaches its user as any failed run does."""
    stored = store.load(record.run_id) if store.exists(record.run_id) else None
    if stored is not None and stored.state.is_final:
        state, reason = stored.state, stored.reason or ""
    elif isinstance(error, TfctlError):
        state, reason = RunState.FAILED, error.message.splitlines()[0]
    else:
        state, reason = RunState.STOPPED, "interrupted during start"
    with Notifier.of(stored or record) as notifier:
        notifier.tell(stored or record, Notify.of_end(Outcome(state, reason)))


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


def resume_files(cluster: Cluster, earlier: str, filesystems: Mapping[str, str], progress: Progress) -> None:
    """Bring the earlier run's files (checkpoints) into this run's directory on every host, once
    per filesystem: a task finds them in its $TFCTL_RUN_DIR and resumes from them."""
    firsts = one_per_filesystem(filesystems)
    answers = cluster.fan_out(list(firsts), lambda a: a.call(ResumeRequest(cluster.record.run_id, earlier)))
    answers.raise_if_failed(f"resuming run {earlier}")
    for host, answer in sorted(answers.succeeded.items()):
        if not answer.found:
            message = f"nothing of run {earlier} here (pruned, or it never ran here): its tasks start afresh"
        else:
            files = answer.linked + answer.copied
            message = f"resumes run {earlier}: {files} file{'s' if files != 1 else ''} of it now in {answer.dest}"
        progress(host, message)
        for other in firsts[host]:
            progress(other, f"shares its home directory with {host}: resumed there, once")


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
    groups = one_per_filesystem({host: plan.filesystem for host, plan in plans.succeeded.items()})
    result = cluster.fan_out(groups, lambda a: apply_host(a, manifest, name, dest, plans.succeeded[a.host].need))
    result.raise_if_failed("syncing the workdir")
    for host, answer in sorted(result.succeeded.items()):
        progress(host, f"synced: {answer.copied} of {answer.files} files changed, now in {dest}")
        for other in groups[host]:
            progress(other, f"shares its home directory with {host}: the same copy, synced once")
