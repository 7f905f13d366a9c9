"""Command line: parse arguments, call lifecycle, render (`render.py`). Nothing else lives here.

`-f/--file` names the cluster file before the verb (`tfctl -f FILE logs -f`, as in docker
compose) or after it on every verb but `logs`, where `-f` means follow.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

from tfctl import __version__
from tfctl.errors import EXIT_INTERRUPTED, TfctlError, UsageError

if TYPE_CHECKING:
    from tfctl.cluster import Cluster
    from tfctl.runs import RunRecord, RunStore, TaskSpec

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_FILE = Path("cluster.yaml")


def _file_option(short: bool = True) -> Callable[[F], F]:
    names = ("-f", "--file") if short else ("--file",)
    return click.option(
        *names,
        "cluster_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Cluster file (default: ./cluster.yaml).",
    )


_accept_new_option = click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Trust and pin SSH host keys seen for the first time (like StrictHostKeyChecking=accept-new); "
    "a changed key is always refused.",
)


def _cluster_file(ctx: click.Context, given: Path | None) -> Path:
    path = given or ctx.obj.get("cluster_file")
    if path is not None:
        return path
    if not DEFAULT_FILE.exists():
        raise UsageError(
            "no cluster.yaml in the current directory",
            hint="pass -f FILE, create one with `tfctl init`, "
            "or try the localhost example: tfctl -f cluster.yaml.example up",
        )
    return DEFAULT_FILE


def _store() -> RunStore:
    from tfctl.runs import RunStore

    return RunStore()


def _record(ctx: click.Context, given: Path | None, run_id: str | None, resume: bool = True) -> RunRecord:
    """The run the command is about. With `resume`, a live run whose controller died gets a new
    watcher first, and the user hears of it."""
    from tfctl import console, lifecycle

    path = None if run_id else _cluster_file(ctx, given)
    store = _store()
    record = lifecycle.resolve_run(store, path or Path("."), run_id)
    note = lifecycle.resume_supervision(store, record) if resume else None
    if note:
        console.err().print(f"[yellow]warning:[/yellow] {note}")
        record = store.load(record.run_id)
    return record


def _stamp(start: float) -> str:
    return f"[{time.monotonic() - start:5.1f}s]"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@_file_option()
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append timed events (host calls, SSH channels) to FILE as JSON lines.",
)
@click.version_option(__version__, prog_name="tfctl")
@click.pass_context
def cli(ctx: click.Context, cluster_file: Path | None, trace_file: Path | None) -> None:
    """Launch, watch and stop distributed TensorFlow clusters from one cluster file."""
    if trace_file is not None:
        os.environ["TFCTL_TRACE"] = str(trace_file.resolve())  # the detached watcher inherits it
    ctx.obj = {"cluster_file": cluster_file}


@cli.command()
@_file_option()
@click.option("-d", "--detach", is_flag=True, help="Return once every task runs; a watcher stops the run when done.")
@click.option("--dry-run", is_flag=True, help="Print each task's host, command and TF_CONFIG; start nothing.")
@_accept_new_option
@click.pass_context
def up(ctx: click.Context, cluster_file: Path | None, detach: bool, dry_run: bool, accept_new_host_keys: bool) -> int:
    """Start the cluster: ps first, then chief and workers; follow it to its end unless -d."""
    from rich.text import Text

    from tfctl import console, lifecycle
    from tfctl.config import load_config

    path = _cluster_file(ctx, cluster_file)
    config = load_config(path)
    store = _store()
    plan = lifecycle.plan_run(config, store)
    if dry_run:
        for task in plan.record.tasks:
            console.out().print(f"[bold]{task.name}[/bold]  {task.address}")
            console.out().print(f"  command:   {task.command}", markup=False)
            console.out().print(f"  cwd:       {task.cwd}", markup=False)
            console.out().print(f"  TF_CONFIG: {task.env['TF_CONFIG']}", markup=False)
        return 0
    lifecycle.ensure_no_live_run(store, config)
    err = console.err()
    for warning in lifecycle.security_warnings(config):
        err.print(Text("warning: ", style="bold yellow") + Text(warning))
    record = plan.record
    err.print(
        f"run [bold]{record.run_id}[/bold]: {len(record.tasks)} tasks on {len(record.hosts)} "
        f"host{'s' if len(record.hosts) != 1 else ''}"
    )
    start = time.monotonic()

    def progress(who: str, message: str) -> None:
        err.print(f"{_stamp(start)} {who:<12} {message}", markup=False)

    try:
        with err.status("starting tasks…", spinner="dots") if err.is_terminal else contextlib.nullcontext():
            cluster = lifecycle.launch(store, plan, progress, accept_new_host_keys, detach)
    except KeyboardInterrupt:
        err.print("interrupted: everything started has been stopped")
        return EXIT_INTERRUPTED
    err.print(f"{_stamp(start)} all {len(record.tasks)} tasks running")
    hint_file = f"-f {path} " if path != DEFAULT_FILE else ""
    with cluster:
        if not detach:
            return _attached(store, cluster, hint_file)
        lifecycle.spawn_watcher(store, cluster.record)
    err.print(
        f"detached. The run stops by itself when {', '.join(record.decisive)} "
        f"{'finishes' if len(record.decisive) == 1 else 'finish'} (a watcher process does it)."
    )
    err.print(f"  tfctl {hint_file}status      tfctl {hint_file}logs -f      tfctl {hint_file}down")
    console.out().print(record.run_id, markup=False)
    return 0


def _attached(store: RunStore, cluster: Cluster, hint_file: str) -> int:
    """Follow an attached run to its end; the caller closes the cluster."""
    from rich.text import Text

    from tfctl import console, lifecycle, render
    from tfctl.logs import Prefixer
    from tfctl.tf.doctor import LiveNotes, diagnose_run

    err = console.err()
    record = cluster.record
    prefix = Prefixer([t.name for t in record.tasks], console.color_enabled(sys.stdout))
    err.print("following all task logs; Ctrl-C stops the cluster")

    notes = LiveNotes(cluster)

    def on_lines(batch: list[tuple[str, str]]) -> None:
        render.print_lines(batch, prefix, notes)

    try:
        ending = lifecycle.attach(store, cluster, on_lines)
    except KeyboardInterrupt:
        err.print("\nCtrl-C: stopping the cluster (press Ctrl-C again to detach and leave it to `tfctl down`)")
        try:
            render.render_stop(lifecycle.interrupt(store, cluster))
        except KeyboardInterrupt:
            lease = f" (they stop by themselves within {record.lease_timeout:g}s)" if record.lease_timeout else ""
            err.print(
                f"detached; tasks may still be running{lease}. Stop them with: "
                f"tfctl {hint_file}down --run {record.run_id}"
            )
        return EXIT_INTERRUPTED
    if ending.outcome.succeeded:
        err.print(f"[green]job succeeded[/green]: {ending.outcome.reason}")
    else:
        err.print(Text("job failed", style="red") + Text(f": {ending.outcome.reason}"))
        culprit = ending.outcome.culprit
        if culprit:
            statuses, _ = cluster.status()
            finding = diagnose_run(cluster, statuses).findings.get(culprit)
            if finding is not None:
                err.print(render.finding_text(culprit, finding))
    render.render_stop(ending.stop)
    return 0 if ending.outcome.succeeded and ending.stop.clean else 1


@cli.command()
@_file_option()
@click.option("--run", "run_id", help="Run id (default: the newest run of the cluster file).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per task.")
@click.option("--watch", is_flag=True, help="Refresh every second until Ctrl-C.")
@click.pass_context
def status(ctx: click.Context, cluster_file: Path | None, run_id: str | None, as_json: bool, watch: bool) -> int:
    """Show every task: state, pid, exit code, uptime, listening, last log line."""
    from tfctl import console, render
    from tfctl.cluster import Cluster

    record = _record(ctx, cluster_file, run_id)
    with Cluster(record) as cluster:
        if as_json:
            from tfctl.tf.doctor import diagnose_run, finding_json

            statuses, _ = cluster.status()
            found = diagnose_run(cluster, statuses)
            console.out().print_json(
                json.dumps(
                    [
                        {
                            **s.to_json(),
                            "diagnosis": finding_json(found.findings.get(s.task)),
                            "last_line": found.last_lines.get(s.task, s.last_line),
                        }
                        for s in statuses
                    ]
                )
            )
            return 0
        if not watch:
            console.out().print(render.status_table(cluster, console.out().width))
            return 0
        from rich.live import Live

        with Live(render.status_table(cluster, console.out().width), console=console.out(), auto_refresh=False) as live:
            while True:
                time.sleep(1)
                live.update(render.status_table(cluster, console.out().width), refresh=True)


@cli.command()
@_file_option(short=False)
@click.argument("tasks", nargs=-1)
@click.option("-f", "--follow", is_flag=True, help="Keep streaming; ends by itself when the run ends.")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines of each task.")
@click.option("--run", "run_id", help="Run id (default: the newest run of the cluster file).")
@click.pass_context
def logs(
    ctx: click.Context,
    cluster_file: Path | None,
    tasks: tuple[str, ...],
    follow: bool,
    tail: int | None,
    run_id: str | None,
) -> int:
    """Print task output, merged and prefixed. TASK is `job` or `job:index` (default: all)."""
    from tfctl import console, render
    from tfctl.cluster import Cluster
    from tfctl.logs import LogFollower, Prefixer
    from tfctl.tf.doctor import LiveNotes

    files = [name for name in tasks if name.endswith((".yaml", ".yml")) or Path(name).is_file()]
    if files:
        raise UsageError(
            f"{files[0]} is not a task: `-f` after `logs` means --follow",
            hint=f"name the cluster file with --file: tfctl logs --file {files[0]} -f "
            f"(or before the verb: tfctl -f {files[0]} logs -f)",
        )
    record = _record(ctx, cluster_file, run_id)
    selected = _select_tasks(record, tasks)
    prefix = Prefixer([t.name for t in record.tasks], console.color_enabled(sys.stdout))
    store = _store()
    last_check = time.monotonic()
    with Cluster(record) as cluster, LogFollower(cluster, selected, follow and record.active, tail) as follower:
        notes = LiveNotes(cluster) if follow else None
        try:
            for batch in follower.batches():
                render.print_lines(batch, prefix, notes)
                if follow and not batch and time.monotonic() - last_check > 2:
                    # Tasks of a run that ended before starting them never produce an end of stream.
                    last_check = time.monotonic()
                    if not store.load(record.run_id).active:
                        follower.finish()
                        follow = False
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    for problem in follower.errors:
        console.err().print(f"[red]{problem}[/red]")
    return 1 if follower.errors else 0


def _select_tasks(record: RunRecord, names: tuple[str, ...]) -> list[TaskSpec]:
    if not names:
        return list(record.tasks)
    chosen = []
    for name in names:
        match = [t for t in record.tasks if name in (t.job, t.name)]
        if not match:
            valid = ", ".join(sorted({t.job for t in record.tasks} | {t.name for t in record.tasks}))
            raise UsageError(f"no task {name!r} in run {record.run_id}", hint=f"choose from: {valid}")
        chosen += [t for t in match if t not in chosen]
    return chosen


@cli.command()
@_file_option()
@click.option("--run", "run_id", help="Run id (default: the newest run of the cluster file).")
@click.option(
    "--all",
    "sweep",
    is_flag=True,
    help="Also stop processes on the cluster's hosts left by runs that are no longer live.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds between SIGTERM and SIGKILL (default: the cluster file's grace_period).",
)
@click.pass_context
def down(ctx: click.Context, cluster_file: Path | None, run_id: str | None, sweep: bool, grace: float | None) -> int:
    """Stop every process of the run on every host, then prove nothing remains."""
    from tfctl import console, lifecycle, render

    store = _store()
    try:
        record = _record(ctx, cluster_file, run_id, resume=False)
    except UsageError:
        if not sweep:
            raise
        record = None
    clean = True
    if record is not None:
        report = lifecycle.down(store, record, grace)
        console.err().print(f"run {record.run_id}:", markup=False)
        render.render_stop(report)
        clean = report.clean
    if sweep:
        from tfctl.config import load_config
        from tfctl.plan import host_specs

        if record is not None:
            hosts, default_grace = record.hosts, record.grace_period
        else:
            config = load_config(_cluster_file(ctx, cluster_file))
            hosts, default_grace = host_specs(config), config.grace_period
        for host, answer in lifecycle.sweep(store, hosts, default_grace if grace is None else grace).items():
            runs = ", ".join(answer.runs) or "none"
            console.err().print(
                f"{host}: {answer.processes} orphaned processes stopped (runs: {runs}); {len(answer.remaining)} remain",
                markup=False,
            )
            clean = clean and not answer.remaining
    return 0 if clean else 1


@cli.command()
@_file_option()
@click.option(
    "--network/--no-network",
    default=True,
    help="Also check that every host reaches the ps ports (or, without ps, every worker port).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@_accept_new_option
@click.pass_context
def check(
    ctx: click.Context, cluster_file: Path | None, network: bool, as_json: bool, accept_new_host_keys: bool
) -> int:
    """Check every host as `up` would (SSH, versions, free ports, network) and start nothing."""
    from rich.table import Table

    from tfctl import console, lifecycle
    from tfctl.config import load_config

    plan = lifecycle.plan_run(load_config(_cluster_file(ctx, cluster_file)), _store())
    start = time.monotonic()
    report = lifecycle.check(
        plan,
        network,
        lambda who, msg: console.err().print(f"{_stamp(start)} {who:<12} {msg}", markup=False),
        accept_new_host_keys,
    )
    if as_json:
        console.out().print_json(
            json.dumps(
                {
                    "hosts": [
                        {
                            "host": i.host,
                            "hostname": i.hostname,
                            "python": i.python,
                            "tensorflow": i.tensorflow,
                            "error": i.error,
                        }
                        for i in report.hosts
                    ],
                    "warnings": report.warnings,
                    "busy_ports": {address: info.to_wire() for address, info in report.busy.items()},
                    "network": report.network,
                }
            )
        )
    else:
        table = Table(box=None, pad_edge=False)
        for col in ("HOST", "HOSTNAME", "PYTHON", "TENSORFLOW"):
            table.add_column(col, no_wrap=True)
        for i in report.hosts:
            table.add_row(i.host, i.hostname, i.python or "-", i.tensorflow or "-")
        console.out().print(table)
        for warning in report.warnings:
            console.err().print(f"warning: {warning}", markup=False)
        for address, info in report.busy.items():
            console.err().print(
                f"port in use: {address} (pid {', '.join(map(str, info.pids)) or '?'} {info.command})", markup=False
            )
        if report.network:
            console.err().print(report.network, markup=False)
    return 1 if report.busy else 0


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."))
@click.option("-t", "--template", default=None, help="Template to use (default: between-graph-async).")
@click.option("--list", "list_only", is_flag=True, help="List the templates and exit.")
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
def init(directory: Path, template: str | None, list_only: bool, force: bool) -> int:
    """Write a cluster file and a training script that run as generated on this machine."""
    from tfctl import console, templates

    if list_only:
        for name, title in templates.available().items():
            console.out().print(f"{name:<24} {title}", markup=False)
        return 0
    written = templates.install(template or templates.DEFAULT_TEMPLATE, directory, force)
    for path in written:
        console.err().print(f"wrote {path}", markup=False)
    where = "" if directory == Path(".") else f"cd {directory} && "
    console.err().print(f"next: {where}tfctl up        (edit cluster.yaml to add your hosts)", markup=False)
    return 0


@cli.command(name="runs")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def runs_command(as_json: bool) -> int:
    """List the runs tfctl remembers, newest last."""
    from tfctl import console

    records = _store().all()
    if as_json:
        console.out().print_json(
            json.dumps(
                [
                    {
                        "run_id": r.run_id,
                        "cluster": r.cluster_name,
                        "file": r.cluster_file,
                        "state": r.state.value,
                        "created_at": r.created_at,
                        "reason": r.reason,
                    }
                    for r in records
                ]
            )
        )
        return 0
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at))
        console.out().print(f"{r.run_id:<40} {when}  {r.state.value:<10} {r.reason or ''}", markup=False)
    return 0


@cli.command(name="_watch", hidden=True)
@click.option("--run", "run_id", required=True)
def watch_command(run_id: str) -> int:
    """Detached watcher started by `up -d`: ends the run when the job is done."""
    from tfctl import lifecycle, render

    ending = lifecycle.watch(_store(), run_id)
    if ending is not None:
        print(f"{ending.outcome.reason}; {render.stop_summary(ending.stop)}", flush=True)
    return 0


def main() -> None:
    """Entry point: the one place that maps errors to exit codes."""
    try:
        code = cli.main(standalone_mode=False)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except click.exceptions.Abort:
        code = EXIT_INTERRUPTED
    except click.ClickException as e:
        e.show()
        code = 2
    except TfctlError as e:
        from rich.text import Text

        from tfctl import console

        console.err().print(Text("error: ", style="bold red") + Text(e.message))
        if e.hint:
            console.err().print(Text("hint: ", style="bold") + Text(e.hint))
        code = e.exit_code
    sys.exit(code if isinstance(code, int) else 0)
