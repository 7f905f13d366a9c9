"""What each verb does, from cluster file to stopped processes, without rendering anything.

The CLI parses arguments and renders; this module decides. Progress is reported through
callbacks so the same code serves an attached `up`, a detached watcher and the tests.

What only a started run needs (log following, the door, the doctor) is imported where it is
used: `up -d` forks as soon as the run is planned, and none of it should load before the tasks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from tfctl import control
from tfctl.cluster import Cluster, HostInfo, Progress, StopReport
from tfctl.control import Judge, Outcome
from tfctl.devices import gpu_hosts, place
from tfctl.errors import StartupError, TfctlError, UsageError
from tfctl.group import fan_out
from tfctl.hostagent import HostAgent
from tfctl.hosts import HostSpec
from tfctl.model import ClusterConfig
from tfctl.plan import Plan, make_plan, remote_workdir, with_devices
from tfctl.runs import RunRecord, RunStore, new_run_id
from tfctl.setup import once_per_workdir, run_setup
from tfctl.supervisor.protocol import PortInfo, RunState, SweepAnswer, SweepRequest
from tfctl.sync import apply_host, build_manifest, one_per_filesystem, plan_host
from tfctl.tf.cluster import exposed_addresses
from tfctl.trace import traced
from tfctl.transport import connect
from tfctl.watcher import Report, controller_gone, controller_of_this_process, stop_watcher, wait_gone

if TYPE_CHECKING:
    from tfctl.slurm.allocation import JobState

LOG_DRAIN_SECONDS = 10.0


@traced("lifecycle.ensure_no_live_run")
def ensure_no_live_run(store: RunStore, config: ClusterConfig) -> None:
    """Refuse a second live run of the same cluster: the ports and the tasks would collide."""
    record = store.latest(config.path)
    if record is None or (not record.active and record.left_nothing):
        return  # its stop proved nothing of it left on any host: no need to ask them again
    if record.allocation is not None and allocation_ended(record.allocation):
        return
    if record.state is RunState.STARTING and record.watcher and not controller_gone(record):
        raise UsageError(
            f"run {record.run_id} of cluster {config.name!r} is starting (syncing, setup or starting tasks; "
            f"{'its `tfctl up`' if record.watcher.get('attached') else 'its watcher'} is pid {record.watcher['pid']})",
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
    config: ClusterConfig, store: RunStore, run_id: str | None = None, allocation: dict[str, Any] | None = None
) -> Plan:
    plan = make_plan(config, run_id or new_run_id(config.name))
    record = dataclasses.replace(plan.record, store=store.store_id, allocation=allocation)
    return dataclasses.replace(plan, record=record)


def allocate(store: RunStore, config: ClusterConfig, progress: Progress) -> Plan:
    """Backend slurm: the plan of a run placed on an allocation that Slurm has granted."""
    from tfctl.slurm.backend import allocate as allocate_nodes

    run_id = new_run_id(config.name)
    placed, allocation = allocate_nodes(config, run_id, progress)
    return plan_run(placed, store, run_id, allocation)


def allocation_ended(allocation: dict[str, Any]) -> bool:
    """Slurm ended the run's allocation: nothing of the run can still be running."""
    from tfctl.slurm.allocation import job_state

    return job_state(allocation["job_id"]).ended


def release(record: RunRecord) -> JobState | None:
    """End the Slurm allocation the run asked for, if any; its state once Slurm says it ended."""
    if record.allocation is None:
        return None
    from tfctl.slurm.backend import release as release_allocation

    return release_allocation(record.allocation)


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
    watcher: dict[str, Any] | None = None,
) -> Cluster:
    """Preflight every host, place the tasks on its GPUs and cores, check ports, record the run,
    sync code, run `setup`, and start the tasks phase by phase.

    Nothing is started anywhere until every host has answered; any failure after that stops
    whatever was started before the error is raised. The caller closes the returned cluster.
    An attached run (not `detach`) holds a lease on its hosts while the cluster is open, and
    records this process as its controller; a detached one records `watcher`, if given.
    """
    if detach:
        record = dataclasses.replace(plan.record, lease_timeout=0.0, watcher=watcher)
    else:
        record = dataclasses.replace(plan.record, watcher=controller_of_this_process(attached=True))
    cluster = Cluster(record, accept_new_host_keys=accept_new_host_keys, holds_lease=not detach)
    try:
        on_slurm = plan.config.backend == "slurm"  # there each task's step asks Slurm for its devices
        infos = cluster.preflight(progress, set() if on_slurm else gpu_hosts(plan.config.device_asks()))
        for warning in version_warnings(infos):
            progress("warning", warning)
        if not on_slurm:
            plan = with_devices(plan, {i.host: i.devices for i in infos})
            record = cluster.record = dataclasses.replace(record, tasks=plan.record.tasks)
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
    remote = [h.name for h in plan.record.hosts if h.transport.get("kind") != "local"]
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


@dataclass(frozen=True)
class Ending:
    """How an attached or watched run ended."""

    outcome: Outcome
    stop: StopReport
    record: RunRecord


def stop_run(store: RunStore, cluster: Cluster, grace: float | None = None) -> tuple[StopReport, JobState | None]:
    """Stop every task of the run, then end the Slurm allocation it asked for, if any. The record
    keeps whether the stop proved nothing left, so the next `up` need not ask the hosts again."""
    report = cluster.stop(grace)
    store.update(cluster.record.run_id, left_nothing=report.clean)
    return report, release(cluster.record)


def finish(store: RunStore, cluster: Cluster, outcome: Outcome) -> Ending:
    """Stop whatever still runs (the ps above all) and record how the run ended."""
    report, _ = stop_run(store, cluster)
    record = store.end(cluster.record.run_id, outcome.state, outcome.reason)
    return Ending(outcome, report, record)


def attach(store: RunStore, cluster: Cluster, on_lines: Callable[[list[tuple[str, str]]], None]) -> Ending:
    """Stream every task's output until the job is decided, then stop the rest of the cluster.

    KeyboardInterrupt propagates to the caller with the run still up; the caller stops it.
    """
    from tfctl.door import controller_door
    from tfctl.logs import LogFollower

    follower = LogFollower(cluster, cluster.record.tasks, follow=True)
    decided: list[Outcome] = []
    quit_watching = threading.Event()

    def watch() -> None:
        try:
            decided.append(
                control.supervise(
                    cluster,
                    host_patience=cluster.record.host_timeout,
                    cancelled=quit_watching.is_set,
                    judge=run_judge(cluster),
                    on_unreachable=note_unreachable(store, cluster.record.run_id),
                )
            )
        except TfctlError as e:
            decided.append(Outcome(RunState.FAILED, e.message))

    def on_down(grace: float | None) -> tuple[StopReport, JobState | None]:
        stopped = stop_run(store, cluster, grace)
        if store.load(cluster.record.run_id).active:
            store.end(cluster.record.run_id, RunState.STOPPED, "tfctl down")
        return stopped  # the supervision thread sees the tasks stopped and ends the run as it would

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    door = controller_door(store, cluster, on_down)
    door.open()
    try:
        for batch in follower.batches():
            on_lines(batch)
            if decided:
                break
        if not decided:  # every stream ended: all tasks are over; let the watcher see it
            watcher.join()
        ending = finish(store, cluster, decided[0] if decided else Outcome(RunState.FAILED, "supervision ended"))
        drain_until = time.monotonic() + LOG_DRAIN_SECONDS
        finishing = True
        for batch in follower.batches():
            on_lines(batch)
            if finishing and time.monotonic() > drain_until:
                follower.finish()  # tasks that never started send no end: read what is left, once
                finishing = False
        return ending
    finally:
        door.close()
        quit_watching.set()
        follower.close()


def note_unreachable(store: RunStore, run_id: str) -> Callable[[dict[str, float]], None]:
    """Record the hosts the controller cannot reach, and since when, for `status` to show."""

    def note(since: dict[str, float]) -> None:
        store.update(run_id, unreachable=since)

    return note


def run_judge(cluster: Cluster) -> Judge | None:
    """What ends a run beyond its tasks' states: a task hung for good, Slurm ending the allocation."""
    from tfctl.tf.doctor import HangJudge

    limit = cluster.record.hang_timeout
    judges: list[Judge] = [HangJudge(cluster, limit)] if limit else []
    if cluster.record.allocation is not None:
        from tfctl.slurm.backend import allocation_judge

        judges.insert(0, allocation_judge(cluster.record.allocation))
    if not judges:
        return None
    return lambda statuses: next((o for o in (judge(statuses) for judge in judges) if o is not None), None)


def interrupt(store: RunStore, cluster: Cluster) -> StopReport:
    """First Ctrl-C of an attached run: stop the whole cluster."""
    report, _ = stop_run(store, cluster)
    store.end(cluster.record.run_id, RunState.STOPPED, "interrupted (Ctrl-C)")
    return report


# ---------------------------------------------------------------- detached runs


def launch_and_watch(store: RunStore, plan: Plan, accept_new_host_keys: bool, report: Report) -> Ending | None:
    """Body of the watcher that `up -d` forks first: start the run (its progress, then
    `running`, or the error, go to `report`, which `up -d` prints), then watch it with the same
    connections, so no host is connected to twice. SIGTERM during the start is `up -d`'s Ctrl-C:
    everything started is stopped."""

    started, stopping = threading.Event(), threading.Event()

    def on_sigterm(*_: object) -> None:  # one handler, so no SIGTERM falls between two
        if not started.is_set():
            raise KeyboardInterrupt
        stopping.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        cluster = launch(
            store,
            plan,
            lambda who, message: report({"progress": [who, message]}),
            accept_new_host_keys,
            detach=True,
            watcher=controller_of_this_process(attached=False),
        )
    except KeyboardInterrupt:
        report({"interrupted": True})
        return None
    except TfctlError as e:
        report({"error": e.message, "hint": e.hint, "exit_code": e.exit_code})
        return None
    started.set()
    report({"running": True})
    with cluster:
        return _watch(store, cluster, stopping)


def watch(store: RunStore, run_id: str) -> Ending | None:
    """Body of a watcher started for a running run (`up -d` on Slurm, or a controller that
    died): supervise until decided, then stop the run."""
    record = store.load(run_id)
    if not record.active:
        return None
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with Cluster(record) as cluster:
        return _watch(store, cluster, stopping)


def _watch(store: RunStore, cluster: Cluster, stopping: threading.Event) -> Ending | None:
    """Supervise until decided, then stop the run. `stopping` (SIGTERM) ends it without
    stopping anything; a `down` through its door stops the run with its connections."""
    from tfctl.door import controller_door

    record, run_id = cluster.record, cluster.record.run_id
    handover = DownHandover(stopping)
    with controller_door(store, cluster, handover.ask):
        outcome = control.supervise(
            cluster,
            host_patience=record.host_timeout,
            cancelled=stopping.is_set,
            judge=run_judge(cluster),
            on_unreachable=note_unreachable(store, run_id),
        )
        if not stopping.is_set():
            ending = finish(store, cluster, outcome)
            handover.answer(ending.stop, None)  # a `down` arriving meanwhile hears what was stopped
            return ending
        if handover.grace is None:
            handover.answer(None, None)
            return None
        report, job = stop_run(store, cluster, handover.grace.value)
        if store.load(run_id).active:
            store.end(run_id, RunState.STOPPED, "tfctl down")
        handover.answer(report, job)
        return None


@dataclass(frozen=True)
class _Grace:
    value: float | None


class DownHandover:
    """A `down` that reached the detached watcher through its door. The door's thread waits while
    the watcher's own thread ends supervision and then stops the run, so the two never race."""

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping
        self.grace: _Grace | None = None
        self._done = threading.Event()
        self._result: tuple[StopReport | None, JobState | None] = (None, None)

    def ask(self, grace: float | None) -> tuple[StopReport | None, JobState | None]:
        if not self._done.is_set():
            self.grace = _Grace(grace)
            self._stopping.set()
            self._done.wait()
        return self._result

    def answer(self, report: StopReport | None, job: JobState | None) -> None:
        """What was stopped (None: the watcher ends without stopping anything)."""
        self._result = (report, job)
        self._done.set()


def _down_patience(record: RunRecord, grace: float | None) -> float:
    """How long a live controller may take to stop the run: the grace period, and some."""
    return (record.grace_period if grace is None else grace) + 60.0


def _job_state(fields: dict[str, Any]) -> JobState:
    from tfctl.slurm.allocation import JobState

    return JobState(fields["state"], fields["reason"], tuple(fields["nodes"]))


def down(store: RunStore, record: RunRecord, grace: float | None) -> tuple[StopReport, JobState | None]:
    """Stop every task, then end the run's Slurm allocation; the report, and the allocation's
    state once ended (None: the run has none of its own). A live controller on this machine does
    it with the connections it holds; else this process connects to every host."""
    from tfctl import live

    answer = live.ask(store.run_dir(record.run_id), record, "down", {"grace": grace}, _down_patience(record, grace))
    if answer is not None and answer["stop"] is not None:
        wait_gone(record)  # a detached watcher ends once it has answered
        job = answer["allocation"]
        return StopReport(**answer["stop"]), None if job is None else _job_state(job)
    stop_watcher(record)
    with Cluster(record) as cluster:
        report, allocation = stop_run(store, cluster, grace)
    if record.active:
        store.end(record.run_id, RunState.STOPPED, "tfctl down")
    return report, allocation


def sweep(store: RunStore, hosts: tuple[HostSpec, ...], grace: float) -> dict[str, SweepAnswer]:
    """Stop processes on these hosts that carry the marker of no live run (orphans)."""
    live = [r.run_id for r in store.all() if r.active]
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(HostAgent(connect(spec), spec.python, spec.root)) for spec in hosts]
        result = fan_out(agents, lambda a: a.host, lambda a: a.call(SweepRequest(live, grace, store.store_id)))
    result.raise_if_failed("stopping orphans")
    return result.succeeded


@dataclass(frozen=True)
class CheckReport:
    hosts: list[HostInfo]
    warnings: list[str]
    busy: dict[str, PortInfo]
    network: str | None  # the reachability summary, when checked


def check(plan: Plan, network: bool, progress: Progress, accept_new_host_keys: bool = False) -> CheckReport:
    """What `up` would find out before starting anything, without starting anything.

    With `network`, the ports of the tasks others must reach (the ps, or every worker for
    all-reduce) are held open by throw-away listeners and probed from every other host.
    """
    with Cluster(plan.record, accept_new_host_keys=accept_new_host_keys) as cluster:
        asks = plan.config.device_asks()
        infos = cluster.preflight(progress, gpu_hosts(asks))
        place(asks, {i.host: i.devices for i in infos})  # raises if tasks ask a host for more than it has
        busy = cluster.busy_ports(list(plan.record.tasks))
        summary = None
        if network and not busy:
            summary = _check_network(cluster, plan)
        return CheckReport(infos, version_warnings(infos), busy, summary)


def _check_network(cluster: Cluster, plan: Plan) -> str:
    targets = [cluster.record.task(name) for phase in plan.phases if phase.probe for name in phase.wait_listening]
    marker = cluster.record.run_id
    by_host: dict[str, list[int]] = {}
    for t in targets:
        by_host.setdefault(t.host, []).append(t.port)
    messages: list[str] = []
    try:
        cluster.hold_ports(by_host, marker, seconds=120)
        cluster.check_reachable(
            sorted({t.host for t in cluster.record.tasks}),
            [t.address for t in targets],
            lambda _who, msg: messages.append(msg),
        )
    finally:
        cluster.release_ports(by_host, marker)
    return messages[-1] if messages else "nothing to check"
