"""`tfctl sweep` (make a sweep's trials and follow them, or `-d` leave them to a driver process)
and `tfctl sweep status` (the results table); `_sweep`, the detached driver."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from tfctl.cli.app import cli, environment
from tfctl.cli.common import cluster_file_path, file_option, run_store, set_option, stamp
from tfctl.errors import EXIT_INTERRUPTED, UsageError

if TYPE_CHECKING:
    from tfctl.config.model import ClusterConfig
    from tfctl.controller.verbs.sweep import TrialEvent, TrialResult
    from tfctl.runs.sweeps import SweepRecord, SweepStore


@cli.group(
    invoke_without_command=True,
    short_help="Run every trial of the file's `sweep:`, each a run.",
    epilog="""\b
Examples:
  tfctl sweep                   run every trial, following; Ctrl-C stops all
  tfctl sweep -d                leave them to a driver; prints the sweep id
  tfctl sweep --max-parallel 4  four at once (the addresses name no port)
  tfctl sweep --grid lr=0.1,0.01 --zip seed=1,2   the trials as flags
  tfctl sweep --resume          go on with the newest sweep after a crash
  tfctl sweep status --json     each trial's params, state and metrics
  tfctl down --sweep ID         stop every trial""",
)
@file_option()
@set_option
@click.option("-d", "--detach", is_flag=True, help="Return once the sweep is recorded; a driver process runs it.")
@click.option("--max-parallel", type=click.IntRange(min=1), default=None, help="Trials at once (default: the file's).")
@click.option(
    "--grid", "grid", multiple=True, metavar="NAME=V1,V2", help="A parameter's values, crossed with the others."
)
@click.option(
    "--zip", "zipped", multiple=True, metavar="NAME=V1,V2", help="Values taken together with the other --zip lists."
)
@click.option(
    "--random",
    "drawn",
    multiple=True,
    metavar="NAME=KIND:...",
    help="A draw: uniform:LOW:HIGH, loguniform:LOW:HIGH, choice:A,B.",
)
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Draws of --random per grid and zip point.")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Seed of the draws.")
@click.option(
    "--resume",
    "resume",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[SWEEP]",
    help="Drive SWEEP again (default: the file's newest): trials not started or stopped go on from their files.",
)
@click.pass_context
def sweep(
    ctx: click.Context,
    cluster_file: Path | None,
    assignments: tuple[str, ...],
    detach: bool,
    max_parallel: int | None,
    grid: tuple[str, ...],
    zipped: tuple[str, ...],
    drawn: tuple[str, ...],
    samples: int | None,
    seed: int | None,
    resume: str | None,
) -> int | None:
    """Run every trial of the cluster file's `sweep:` (or of --grid, --zip and --random, which
    replace what it varies): each a detached run with its own id and $TFCTL_RUN_DIR, at most
    `max_parallel` at once; exit 0 when all succeeded."""
    if ctx.invoked_subcommand is not None:
        return None
    from tfctl import console
    from tfctl.config.params import overrides
    from tfctl.config.sweep_flags import section
    from tfctl.controller.verbs import sweep as verbs
    from tfctl.runs.sweeps import SweepStore

    sweeps = SweepStore(run_store())
    path = cluster_file_path(ctx, cluster_file)
    now = environment(ctx).clock.time()
    if resume is not None:
        making = (grid, zipped, drawn, samples, seed)
        if assignments or max_parallel is not None or any(f not in ((), None) for f in making):
            raise UsageError("--resume drives the sweep as it was made", hint="drop the flags that make trials")
        record = sweeps.resolve(resume, str(path.resolve()))
    else:
        record = verbs.create(
            sweeps,
            path,
            overrides(assignments),
            max_parallel,
            now,
            lambda line: console.err().print(line, markup=False),
            section(grid, zipped, drawn, samples, seed),
        )
    err = console.err()
    err.print(
        f"sweep {record.sweep_id}: {len(record.trials)} trials, {record.max_parallel} at a time"
        + (f", {record.retries} retries each" if record.retries else ""),
        markup=False,
    )
    if detach:
        from tfctl.api.sweeping import spawn_driver

        pid = spawn_driver(sweeps, record, resume is not None)
        err.print(f"driven by pid {pid}; `tfctl sweep status {record.sweep_id}` shows its trials", markup=False)
        click.echo(record.sweep_id)
        return 0
    return _follow(ctx, sweeps, record, resume is not None)


def _follow(ctx: click.Context, sweeps: SweepStore, record: SweepRecord, resuming: bool) -> int:
    """Drive the sweep here, one line per trial event; Ctrl-C or SIGTERM stops every trial."""
    from tfctl import console
    from tfctl.cli.start import Interrupts
    from tfctl.controller.live.watcher import controller_of_this_process
    from tfctl.controller.verbs import sweep as verbs
    from tfctl.engine.clock import Cancel
    from tfctl.runs.record import ControllerKind
    from tfctl.runs.sweeps import SweepState

    err, began = console.err(), time.monotonic()
    stopping = Cancel()
    with Interrupts(stopping, lambda line: err.print(line, markup=False), "every trial"):
        ended = verbs.drive(
            sweeps,
            record.sweep_id,
            controller_of_this_process(ControllerKind.UP),
            environment(ctx).clock,
            stopping,
            _event_printer(began, len(record.trials)),
            _trial_starter(sweeps),
            resuming=resuming,
        )
    rows = verbs.results(sweeps, ended)
    _print_table(rows, None)
    err.print(f"sweep {ended.sweep_id}: {ended.state} ({ended.reason})", markup=False)
    if ended.state is SweepState.STOPPED:
        return EXIT_INTERRUPTED
    return 1 if any(row.state.value != "succeeded" for row in rows) else 0


def _event_printer(began: float, count: int) -> Callable[[TrialEvent], None]:
    from tfctl import console
    from tfctl.runs.record import params_text

    err = console.err()
    width = len(str(count - 1))

    def said(event: TrialEvent) -> None:
        params = params_text(event.params)
        run = f" {event.run_id}" if event.run_id else ""
        why = f": {event.why}" if event.why else ""
        err.print(f"{stamp(began)} trial {event.index:>{width}} {params:<24} {event.state}{run}{why}", markup=False)

    return said


def _trial_starter(sweeps: SweepStore) -> Callable[[ClusterConfig, str | None], str]:
    """A trial started as `tfctl.up` starts a detached run, or, when the file asks a pool,
    submitted to the pool's queue (it starts when there is room): the id of its run."""

    def start(config: ClusterConfig, resumes: str | None) -> str:
        from tfctl.api.starting import up
        from tfctl.controller.verbs.queue import submit

        if config.pool is not None:
            return submit(sweeps.runs, config, resumes=resumes).run_id
        return up(config, detach=True, resume=resumes, home=sweeps.runs.home).id

    return start


@cli.command(name="_sweep", hidden=True)
@click.option("--id", "sweep_id", required=True)
@click.option("--resume", "resuming", is_flag=True)
@click.pass_context
def sweep_driver(ctx: click.Context, sweep_id: str, resuming: bool) -> int:
    """The detached driver of a sweep: starts its trials, ends when the last one does; SIGTERM
    (`down --sweep`) stops every trial."""
    from tfctl.cli.start import Interrupts
    from tfctl.controller.live.watcher import controller_of_this_process
    from tfctl.controller.verbs import sweep as verbs
    from tfctl.engine.clock import Cancel
    from tfctl.runs.record import ControllerKind
    from tfctl.runs.sweeps import SweepStore

    os.nice(10)  # it mostly waits; the tasks starting beside it on this machine come first
    sweeps, stopping, began = SweepStore(run_store()), Cancel(), time.monotonic()
    with Interrupts(stopping, print, "every trial"):
        ended = verbs.drive(
            sweeps,
            sweep_id,
            controller_of_this_process(ControllerKind.WATCHER),
            environment(ctx).clock,
            stopping,
            _event_printer(began, len(sweeps.load(sweep_id).trials)),
            _trial_starter(sweeps),
            resuming=resuming,
        )
    print(f"sweep {ended.sweep_id}: {ended.state} ({ended.reason})", flush=True)
    return 0


@sweep.command(name="status")
@click.argument("sweep_id", required=False, metavar="[SWEEP]")
@click.option("--sort", "sort_by", default=None, metavar="METRIC", help="Order the trials by this metric, best first.")
@click.option("--min", "smallest", is_flag=True, help="With --sort: the smallest is best (a loss).")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@click.pass_context
def sweep_status(ctx: click.Context, sweep_id: str | None, sort_by: str | None, smallest: bool, as_json: bool) -> int:
    """Every trial of SWEEP (default: the cluster file's newest sweep): parameters, state,
    final metrics, wall time and GPU-hours; the best by --sort marked."""
    from tfctl.controller.verbs import sweep as verbs
    from tfctl.runs.sweeps import SweepStore

    sweeps = SweepStore(run_store())
    parent = ctx.parent.params if ctx.parent is not None else {}
    record = sweeps.resolve(
        sweep_id, "" if sweep_id else str(cluster_file_path(ctx, parent.get("cluster_file")).resolve())
    )
    rows = verbs.ranked(verbs.results(sweeps, record), sort_by, smallest)
    if as_json:
        best = verbs.best_of(rows, sort_by)
        click.echo(
            json.dumps(
                {
                    "sweep": record.sweep_id,
                    "state": record.state.value,
                    "reason": record.reason,
                    "best": best,
                    "trials": [row.to_json() for row in rows],
                },
                indent=1,
            )
        )
        return 0
    _print_table(rows, sort_by)
    return 0


def _print_table(rows: list[TrialResult], sort_by: str | None) -> None:
    from rich.table import Table
    from rich.text import Text

    from tfctl import console
    from tfctl.controller.verbs.sweep import best_of, metric_text

    names = list(dict.fromkeys(name for row in rows for name in row.params))
    metrics = list(dict.fromkeys(name for row in rows for name in row.metrics))
    table = Table(box=None, pad_edge=False)
    for column in ["trial", *names, "state", *metrics, "wall", "GPU-h", "run"]:
        table.add_column(column, overflow="fold")
    best = best_of(rows, sort_by)
    for row in rows:
        values = [
            f"{row.index}{' *' if row.index == best else ''}",
            *(str(row.params.get(name, "")) for name in names),
            row.state_text(),
            *(metric_text(row, name) for name in metrics),
            "" if row.wall_seconds is None else f"{row.wall_seconds:.0f}s",
            "" if not row.gpu_hours else f"{row.gpu_hours:.3f}",
            row.run_id or "",
        ]
        table.add_row(*(Text(console.inert(v)) for v in values))
    console.out().print(table)
