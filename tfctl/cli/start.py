"""`tfctl up` (attached or detached) and the detached watcher it leaves behind."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from tfctl.cli.app import cli
from tfctl.cli.common import (
    DEFAULT_FILE,
    accept_new_option,
    cluster_file_path,
    file_option,
    run_store,
    set_option,
    stamp,
)
from tfctl.errors import EXIT_INTERRUPTED, TfctlError

if TYPE_CHECKING:
    from tfctl.cluster.cluster import Cluster
    from tfctl.config.model import ClusterConfig
    from tfctl.controller.live.driver import Ending
    from tfctl.controller.live.watcher import Report
    from tfctl.controller.start.plan import Draft, Plan
    from tfctl.engine.clock import Cancel
    from tfctl.runs.record import RunRecord
    from tfctl.runs.store import RunStore
    from tfctl.supervisor.task_records import ContainerLaunch


@cli.command(
    short_help="Start the cluster and follow it to its end (or -d).",
    epilog="""\b
Examples:
  tfctl up                   start ./cluster.yaml, follow it; Ctrl-C stops it
  tfctl up -f gpu.yaml -d    return once all tasks run; a watcher ends the run
  tfctl up --dry-run         print setup, each task's command, TF_CONFIG, GPUs
  tfctl up --resume          continue the newest run from its checkpoints
  tfctl up --set lr=0.01     the file's `params:` lr at 0.01 for this run""",
)
@file_option()
@click.option("-d", "--detach", is_flag=True, help="Return once every task runs; a watcher stops the run when done.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the setup commands, then each task's host, command, TF_CONFIG and GPUs and cores, and the "
    "warnings `up` would print; start nothing and connect to no host.",
)
@click.option(
    "--resume",
    "resume",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[RUN]",
    help="Continue RUN (default: the file's newest run): its files, checkpoints included, are in each "
    "task's $TFCTL_RUN_DIR, so the templates resume from its last checkpoint.",
)
@set_option
@accept_new_option
@click.pass_context
def up(
    ctx: click.Context,
    cluster_file: Path | None,
    detach: bool,
    dry_run: bool,
    resume: str | None,
    assignments: tuple[str, ...],
    accept_new_host_keys: bool,
) -> int:
    """Start every task, check that the ps listen and are reachable; follow the run to its end unless -d."""
    from tfctl import console
    from tfctl.api.starting import abandoner
    from tfctl.backends.base import backend_for
    from tfctl.config.loader import load_config
    from tfctl.config.params import overrides
    from tfctl.controller.live import launch, watcher
    from tfctl.controller.verbs import up

    path = cluster_file_path(ctx, cluster_file)
    config = load_config(path, overrides(assignments))
    backend = backend_for(config.backend)
    store = run_store()
    hint_file = f"-f {path} " if path != DEFAULT_FILE else ""
    resumes = None if resume is None else up.resumed_run(store, config, resume)
    if not dry_run:
        out, err_console = console.out(), console.err()
        elsewhere = backend.run_elsewhere(
            config,
            detach,
            lambda line: out.print(line, markup=False, highlight=False, soft_wrap=True),
            lambda line: err_console.print(line, markup=False, highlight=False, soft_wrap=True),
            abandoner(store),
            resumes,
        )
        if elsewhere is not None:
            return elsewhere
    if detach and not dry_run and backend.waiting_for is None:  # (else this process waits to acquire)
        cleared = up.ensure_no_live_run(store, config)
        return _up_detached(store, config, accept_new_host_keys, hint_file, cleared, resumes)
    err = console.err()
    _print_warnings(config)
    if dry_run:
        config, note = backend.stand_in(config)
        if note:
            err.print(note, markup=False)
        _print_plan(up.plan_run(config, store))
        return 0
    cleared = up.ensure_no_live_run(store, config)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill`, a batch job's time limit: as Ctrl-C, stop it all now
    start = time.monotonic()
    progress = _progress_printer(start)
    waiting = err.is_terminal and backend.waiting_for is not None
    try:
        with err.status(f"waiting for {backend.waiting_for}…", spinner="dots") if waiting else contextlib.nullcontext():
            run = up.acquire(store, config, progress, resumes)
    except KeyboardInterrupt:
        err.print("interrupted: nothing acquired is left behind")
        return EXIT_INTERRUPTED
    _print_run(run, backend.host_word)
    try:
        with err.status("starting tasks…", spinner="dots") if err.is_terminal else contextlib.nullcontext():
            cluster = launch.launch(store, run, progress, accept_new_host_keys, detach, cleared=cleared)
    except KeyboardInterrupt:
        err.print("interrupted: everything started has been stopped")
        return EXIT_INTERRUPTED
    err.print(f"{stamp(start)} all {len(cluster.record.tasks)} tasks running")
    with cluster:
        if not detach:
            return _attached(store, cluster, hint_file)
        watcher.spawn_watcher(store, cluster.record)
    _print_detached(run.record, hint_file)
    return 0


class Terminated(KeyboardInterrupt):
    """A SIGTERM to `up` (`kill`, a batch job's time limit) while it starts the run: stops what
    was started as Ctrl-C does."""


def _interrupt(*_: object) -> None:
    raise Terminated


class Interrupts:
    """Ctrl-C and SIGTERM while `up` follows a running run, at the edge: the first becomes a
    request on the run's cancel token (the run ends stopped, with its last lines read, or is
    handed over on SIGTERM as its allocation ends); another while it stops raises
    KeyboardInterrupt: `up` detaches, leaving the run to `down`."""

    def __init__(self, stopping: Cancel, say: Callable[[str], None], what: str = "the cluster") -> None:
        self.stopping, self.say, self.what = stopping, say, what
        self.pressed = self.terminated = False
        self._before: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._before[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *_exc: object) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        if signum == signal.SIGTERM:
            self.terminated = True  # said once it is known whether the run is handed over
            self.stopping.set("terminated (SIGTERM)")
        else:
            self.say(f"\nCtrl-C: stopping {self.what} (press Ctrl-C again to detach and leave it to `tfctl down`)")
            self.stopping.set("interrupted (Ctrl-C)")


def _progress_printer(start: float) -> Callable[[str, str], None]:
    """`up`'s progress lines: seconds since `start`, who, what."""
    from tfctl import console

    err = console.err()

    def progress(who: str, message: str) -> None:
        err.print(f"{stamp(start)} {who:<12} {message}", markup=False)

    return progress


def _print_warnings(config: ClusterConfig) -> None:
    from rich.text import Text

    from tfctl import console
    from tfctl.controller.verbs import up

    for warning in up.security_warnings(config):
        console.err().print(Text("warning: ", style="bold yellow") + Text(warning))


def _print_run(run: Draft, place: str) -> None:
    from tfctl import console

    tasks, hosts = len(run.config.tasks()), len(run.record.hosts)
    console.err().print(
        f"run [bold]{run.record.run_id}[/bold]: {tasks} task{'s' if tasks != 1 else ''} on {hosts} "
        f"{place}{'s' if hosts != 1 else ''}" + (f", resuming run {run.record.resumes}" if run.record.resumes else "")
    )


def _up_detached(
    store: RunStore,
    config: ClusterConfig,
    accept_new_host_keys: bool,
    hint_file: str,
    cleared: str | None,
    resumes: str | None,
) -> int:
    """`up -d` of a backend that never waits to acquire hosts: a fork of this process, the run's
    watcher-to-be, starts the run (and then holds those connections for the run's life); this
    process prints its progress (`api.starting.start_detached`). Forked as soon as the run is
    planned and recorded, so what printing needs loads while the tasks start. Ctrl-C here stops
    the start, as attached."""
    import os

    from tfctl import console
    from tfctl.api.starting import Started, start_detached
    from tfctl.controller.live import watcher

    start = time.monotonic()

    def forked(run: Draft) -> Started:
        child, reports = watcher.fork_starter(
            lambda report: _start_then_watch(store, run, accept_new_host_keys, report)
        )

        def reap() -> None:
            with contextlib.suppress(ChildProcessError):  # (reaped already)
                os.waitpid(child, 0)

        return Started(child, reports, reap)

    spinning = contextlib.ExitStack()

    def announce(run: Draft) -> None:  # once forked: a spinner's thread and rich's locks are not the fork's
        _print_warnings(config)
        _print_run(run, "host")
        if console.err().is_terminal:
            spinning.enter_context(console.err().status("starting tasks…", spinner="dots"))

    try:
        with spinning:
            run = start_detached(store, config, forked, _progress_printer(start), cleared, resumes, announce)
    except KeyboardInterrupt:
        console.err().print("interrupted: everything started has been stopped")
        return EXIT_INTERRUPTED
    err = console.err()
    record = store.load(run.id)
    err.print(f"{stamp(start)} all {len(record.tasks)} tasks running")
    _print_detached(record, hint_file)
    return 0


@cli.command(name="_start", hidden=True)
@click.option("--report-fd", type=int, required=True)
@accept_new_option
def start_command(report_fd: int, accept_new_host_keys: bool) -> int:
    """The watcher `tfctl.up()` starts for a detached run (the API forks no caller): the run's
    record as drafted comes pickled on stdin, its cluster as the run keeps it; its progress
    goes to `report_fd`, as a forked watcher's does."""
    import pickle

    from tfctl.controller.live import watcher
    from tfctl.controller.live.resubmit import recorded_config
    from tfctl.controller.start.plan import Draft

    signal.signal(signal.SIGTERM, _interrupt)  # `up`'s Ctrl-C before the start began: nothing started
    store = run_store()

    def start_then_watch(report: watcher.Report) -> None:
        try:
            record = pickle.load(sys.stdin.buffer)
            run = Draft(recorded_config(store, record), record)
        except KeyboardInterrupt:
            report({"interrupted": True})
            return
        except TfctlError as e:  # (its cluster file, kept with the run, no longer parses)
            report({"error": e.message, "hint": e.hint, "exit_code": e.exit_code, "kind": type(e).__name__})
            return
        _start_then_watch(store, run, accept_new_host_keys, report)

    return watcher.report_on(report_fd, start_then_watch)


def _start_then_watch(store: RunStore, run: Draft, accept_new_host_keys: bool, report: Report) -> None:
    """The body of a detached run's watcher, forked or started anew: start the run, reporting to
    the `up` that waits, then log to the run's watch.log and watch it to its end."""
    import os

    from tfctl.controller.live import driver, watcher

    def relayed(message: dict[str, Any]) -> None:
        report(message)
        if "running" in message:
            watcher.log_to_run_dir(store, run.record.run_id)
            os.nice(10)  # from here it mostly waits

    _log_ending(driver.launch_and_watch(store, run, accept_new_host_keys, relayed))


def _print_detached(record: RunRecord, hint_file: str) -> None:
    from tfctl import console

    err = console.err()
    err.print(
        f"detached. The run stops by itself when {', '.join(record.decisive)} "
        f"{'finishes' if len(record.decisive) == 1 else 'finish'} (a watcher process does it)."
    )
    err.print(f"  tfctl {hint_file}status      tfctl {hint_file}logs -f      tfctl {hint_file}down")
    console.out().print(record.run_id, markup=False)


def _print_plan(plan: Plan) -> None:
    """What `up` would run, where, in which order: setup, then each task; and on its events."""
    from tfctl import console
    from tfctl.controller.views.status_table import number_ranges

    out = console.out()
    if plan.setup is not None:
        hosts = ", ".join(t.host for t in plan.setup.tasks)
        out.print(f"[bold]setup[/bold]  once on each host ({hosts}), in its workdir, before any task")
        for command in plan.setup.commands:
            out.print(f"  $ {command}", markup=False)
    if any(t.gpus is not None or t.cpus is not None for t in plan.record.tasks):
        out.print("devices as placed on hosts with just the GPUs and cores their tasks ask for, numbered from 0;")
        out.print("`up` places them on what each host has (and fails if it has too few)")
    for task in plan.record.tasks:
        out.print(f"[bold]{task.name}[/bold]  {task.address}")
        out.print(f"  command:   {task.command}", markup=False)
        out.print(f"  cwd:       {task.cwd}", markup=False)
        out.print(f"  TF_CONFIG: {task.env['TF_CONFIG']}", markup=False)
        if task.gpus is not None:
            out.print(f"  gpus:      CUDA_VISIBLE_DEVICES={task.env['CUDA_VISIBLE_DEVICES']!r}", markup=False)
        if task.cpus is not None:
            out.print(f"  cpus:      cores {number_ranges(task.cpus, ',')}", markup=False)
        if task.container is not None:
            out.print(f"  container: {_container_line(task.container)}", markup=False)
    if plan.record.notify:
        out.print("[bold]notify[/bold]  on this machine, on each of the run's events, with the event on stdin")
        for command in plan.record.notify:
            out.print(f"  $ {command}", markup=False)


def _container_line(box: ContainerLaunch) -> str:
    """A task's container as `--dry-run` shows it: the image, and what of the host it sees."""
    runtime = "the first of podman, docker, apptainer the host has" if box.runtime == "auto" else box.runtime
    parts = [f"image {box.image} in {runtime}", f"python {box.python}", "the workdir and run folder at their paths"]
    if box.mounts:
        parts.append(f"mounts {', '.join(box.mounts)}")
    if box.options:
        parts.append(f"options {' '.join(box.options)}")
    return "; ".join(parts)


def _attached(store: RunStore, cluster: Cluster, hint_file: str) -> int:
    """Follow an attached run to its end; the caller closes the cluster."""
    from rich.text import Text

    from tfctl import console
    from tfctl.cli import render
    from tfctl.cluster.output import Prefixer
    from tfctl.controller.live import driver, resubmit
    from tfctl.controller.views import status_table, status_view
    from tfctl.engine.clock import Cancel
    from tfctl.supervisor.protocol import RunState, TaskState
    from tfctl.tf.doctor import TAIL_LINES, LiveNotes, diagnose_run
    from tfctl.tf.noise import NoiseFolder
    from tfctl.tf.progress import RunProgress

    err = console.err()
    record = cluster.record
    prefix = Prefixer([t.name for t in record.tasks], console.color_enabled(sys.stdout), sys.stdout.isatty())
    err.print("following all task logs; Ctrl-C stops the cluster")

    notes = LiveNotes(cluster)
    folder = NoiseFolder()

    def on_lines(batch: list[tuple[str, str]]) -> None:
        render.print_lines(batch, prefix, notes, folder)

    stopping = Cancel()

    def hand_over() -> str | None:
        handed = resubmit.hand_over(store, cluster) if interrupts.terminated else None
        if handed is None and interrupts.terminated:
            err.print("\nSIGTERM: stopping the cluster (another SIGTERM or Ctrl-C detaches, leaving it to `down`)")
        return handed

    interrupts = Interrupts(stopping, lambda line: err.print(line, markup=False))
    try:
        with interrupts:
            ending = driver.attach(store, cluster, on_lines, notes.forget, stopping, hand_over)
    except KeyboardInterrupt:
        lease = f" (they stop by themselves within {record.lease_timeout:g}s)" if record.lease_timeout else ""
        err.print(
            f"detached; tasks may still be running{lease}. Stop them with: tfctl {hint_file}down --run {record.run_id}"
        )
        return EXIT_INTERRUPTED
    if ending.handed_over is not None:
        err.print(f"\nSIGTERM: {ending.handed_over}")
        return EXIT_INTERRUPTED
    if interrupts.pressed:
        render.render_stop(ending.stop)
        return EXIT_INTERRUPTED
    # One last look at every task: which never got past waiting or never trained and, if the run failed, why.
    # A host the stop could not reach is not asked again: it would hold each look for seconds.
    run_progress = RunProgress(record.progress)
    gone = {*ending.stop.unreachable, *ending.stop.lost_silent}
    statuses, silent = cluster.status(progress=run_progress.rule(), tail=TAIL_LINES, count_lines=True, skip_hosts=gone)
    if silent:  # a host busy with the stop it just made (TF's exits load it): one more look, not a verdict
        statuses, _ = cluster.status(progress=run_progress.rule(), tail=TAIL_LINES, count_lines=True, skip_hosts=gone)
    found = diagnose_run(cluster, statuses, notes.waited)
    culprit = None if ending.outcome.succeeded else ending.outcome.culprit
    finding = found.findings.get(culprit) if culprit else None
    assessed = run_progress.assess(statuses)
    quiet = status_view.silent_tasks(ending.record, statuses, assessed, found)
    # Silent while a peer printed, seen live: a wait it showed since (its session's retry once
    # that peer left) is not the story.
    ended = {s.task for s in statuses if s.state in (TaskState.SUCCEEDED, TaskState.FAILED)}
    quiet.update({t: s for t, s in notes.silent.items() if t not in quiet and t not in ended})
    never_ready = dataclasses.replace(found, never_ready={t: f for t, f in found.never_ready.items() if t not in quiet})
    for note in status_table.never_ready_notes(never_ready, skip=culprit if finding else None):
        err.print(note)
    for note in status_table.untrained_notes(statuses, assessed, quiet):
        err.print(note)
    if ending.outcome.succeeded:
        err.print(Text("job succeeded", style="green") + Text(f": {ending.outcome.reason}"))
    elif ending.outcome.state is RunState.STOPPED:  # `tfctl down` in another terminal, or a task's host stopped it
        err.print(Text("job stopped", style="yellow") + Text(f": {ending.outcome.reason}"))
    else:
        err.print(Text("job failed", style="red") + Text(f": {ending.outcome.reason}"))
        if culprit and finding is not None:
            err.print(status_table.finding_text(culprit, finding))
    render.render_stop(ending.stop)
    return 0 if ending.outcome.succeeded and ending.stop.clean else 1


@cli.command(name="_take_up", hidden=True)
@click.option("--run", "run_id", required=True)
def take_up_command(run_id: str) -> int:
    """A successor allocation's batch script: take up the run the controller before handed over
    (or end it, if it does not go on), and follow it as an attached `up` does."""
    from tfctl import console
    from tfctl.controller.live import resubmit
    from tfctl.engine.verdicts import Outcome

    store = run_store()
    signal.signal(signal.SIGTERM, _interrupt)
    start = time.monotonic()
    try:
        taken = resubmit.take_up(store, run_id, _progress_printer(start))
    except KeyboardInterrupt:
        console.err().print("interrupted: everything started has been stopped")
        return EXIT_INTERRUPTED
    if isinstance(taken, Outcome):
        console.err().print(f"run {run_id} does not go on: {taken.reason}", markup=False)
        return 0 if taken.succeeded else 1
    console.err().print(f"{stamp(start)} all {len(taken.record.tasks)} tasks running")
    with taken:
        return _attached(store, taken, f"-f {taken.record.cluster_file} ")


@cli.command(name="_watch", hidden=True)
@click.option("--run", "run_id", required=True)
def watch_command(run_id: str) -> int:
    """Detached watcher of a running run whose controller died (or one `up -d` left after waiting to acquire its hosts):
    ends the run when the job is done."""
    import os

    from tfctl.controller.live import driver

    os.nice(10)  # it mostly waits; the tasks starting beside it on this machine come first
    _log_ending(driver.watch(run_store(), run_id))
    return 0


def _log_ending(ending: Ending | None) -> None:
    """The watcher's last line in watch.log: how the run ended, what was stopped."""
    from tfctl.cli import render

    if ending is not None:
        print(f"{ending.outcome.reason}; {render.stop_summary(ending.stop)}", flush=True)
