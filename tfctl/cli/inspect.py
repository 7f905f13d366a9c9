"""`tfctl status` and `tfctl logs`: what every task is doing and what it printed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import click

from tfctl.cli.app import cli, environment
from tfctl.cli.common import Duration, file_option, run_record, run_store
from tfctl.cli.complete import run_option, task_names
from tfctl.errors import EXIT_INTERRUPTED, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from tfctl.controller.live.rpc_messages import LogsPart
    from tfctl.engine.clock import Clock
    from tfctl.runs.record import RunRecord
WATCH_EVERY = 1.0  # seconds between two tables of `status --watch`


@cli.command(
    short_help="Show each task's state, progress, exit code, last line.",
    epilog="""\b
Examples:
  tfctl status                  the newest run of ./cluster.yaml
  tfctl status --watch          refresh every second until the run ends
  tfctl status --watch >s.log   a plain table a second, each under its time
  tfctl status --run ID --json  the run and its tasks, as one JSON object""",
)
@file_option()
@run_option
@click.option("--json", "as_json", is_flag=True, help='Print JSON: {"run": {...}, "tasks": [...]}.')
@click.option(
    "--watch",
    is_flag=True,
    help="Refresh every second until the run ends (its last table stays) or Ctrl-C; not on a terminal, "
    "print each table in turn under a line saying when.",
)
@click.pass_context
def status(ctx: click.Context, cluster_file: Path | None, run_id: str | None, as_json: bool, watch: bool) -> int:
    """Show every task: state, pid, exit code, uptime, listening, step and steps/s, last log line."""
    from tfctl import console
    from tfctl.api.reading import status_asker
    from tfctl.supervisor.states import RunState

    record = run_record(ctx, cluster_file, run_id, queued=True)
    if record.state is RunState.QUEUED:
        return _status_of_queued(record, as_json)
    with status_asker(run_store(), record) as ask:

        def table() -> str:
            from tfctl.controller.views.status_table import status_text

            return status_text(*ask(0))

        if as_json:
            shot, latest = ask(0)
            console.out().print_json(json.dumps(shot.to_json(latest)))
        elif not watch:
            sys.stdout.write(table())
        else:
            store = run_store()

            def frame() -> tuple[str, bool]:
                over = not store.load(record.run_id).active  # asked first: this table then shows the end
                return table(), over

            watch_frames(frame, console.out(), environment(ctx).clock)
    return 0


def _status_of_queued(record: RunRecord, as_json: bool) -> int:
    """A queued run has no tasks to ask: its place in the queue and why it waits."""
    from tfctl import console
    from tfctl.controller.verbs.queue import queue_view

    row = next((r for r in queue_view(run_store()).rows if r.record.run_id == record.run_id), None)
    position, why = (row.position, row.why) if row is not None else (None, None)
    if as_json:
        run = {"id": record.run_id, "state": "queued", "pool": record.pool, "position": position, "why": why}
        console.out().print_json(json.dumps({"run": run, "tasks": []}))
    else:
        place = f" (place {position} in the queue)" if position is not None else ""
        console.out().print(
            f"run {record.run_id} is queued{place}: {why or 'waiting for the queue driver to look'}", markup=False
        )
    return 0


def watch_frames(frame: Callable[[], tuple[str, bool]], screen: Console, clock: Clock) -> None:
    """`status --watch`: `frame()` (the table, whether the run had ended before it was asked)
    every WATCH_EVERY seconds of `clock` until the run has ended, its last table shown. A
    terminal sees one table redrawn in place; a pipe or a file (read by a script or later) gets
    every table in turn, flushed at once, each under a line saying when, and no cursor moves."""
    text, over = frame()
    if not screen.is_terminal:
        while True:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock.time()))
            sys.stdout.write(f"--- {stamp} ---\n{text}" + ("" if over else "\n"))
            sys.stdout.flush()
            if over:
                return
            clock.sleep(WATCH_EVERY)
            text, over = frame()
    from rich.live import Live
    from rich.text import Text

    with Live(Text.from_ansi(text), console=screen, auto_refresh=False) as live:
        while not over:
            clock.sleep(WATCH_EVERY)
            text, over = frame()
            live.update(Text.from_ansi(text), refresh=True)


@cli.command(
    short_help="Print task output, merged and prefixed; -f follows.",
    epilog="""\b
Examples:
  tfctl logs -f                   follow every task until the run ends
  tfctl logs --tail 20 worker     the last 20 lines of every worker
  tfctl logs --file g.yaml ps:0   g.yaml's ps:0 (after logs, -f is --follow)""",
)
@file_option(short=False)
@click.argument("tasks", nargs=-1, shell_complete=task_names)
@click.option("-f", "--follow", is_flag=True, help="Keep streaming; ends by itself when the run ends.")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines of each task.")
@click.option("--since", type=Duration(), default=None, help="Only lines written in the last DURATION (90s, 5m, 2h).")
@click.option("-t", "--timestamps", is_flag=True, help="Begin each line with when it was written (UTC).")
@click.option(
    "--raw",
    is_flag=True,
    help="Pass control sequences in task output to the terminal as stored (by default a terminal is shown "
    "them as ^[ ..., never obeys them; colours stay).",
)
@run_option
@click.pass_context
def logs(
    ctx: click.Context,
    cluster_file: Path | None,
    tasks: tuple[str, ...],
    follow: bool,
    tail: int | None,
    since: float | None,
    timestamps: bool,
    raw: bool,
    run_id: str | None,
) -> int:
    """Print task output, merged and prefixed. TASK is `job` or `job:index` (default: all)."""
    from tfctl import console
    from tfctl.api.reading import logs_parts, select_tasks
    from tfctl.controller.live.rpc_messages import LogsAsk

    files = [name for name in tasks if name.endswith((".yaml", ".yml")) or Path(name).is_file()]
    if files:
        raise UsageError(
            f"{files[0]} is not a task: `-f` after `logs` means --follow",
            hint=f"name the cluster file with --file: tfctl logs --file {files[0]} -f "
            f"(or before the verb: tfctl -f {files[0]} logs -f)",
        )
    record = run_record(ctx, cluster_file, run_id)
    selected = select_tasks(record, tasks)
    store = run_store()
    ask = LogsAsk(
        tasks=[t.name for t in selected],
        follow=follow,
        tail=tail,
        since=since,
        timestamps=timestamps,
        color=console.color_enabled(sys.stdout),
        terminal=sys.stdout.isatty() and not raw,
    )
    code = _print_parts(logs_parts(store, record, ask))
    while follow:  # its tasks ended; a resubmitted run's start again in its next allocation
        from tfctl.controller.live.resubmit import next_allocation

        goes_on = next_allocation(store, record)
        if goes_on is None:
            break
        record = goes_on
        console.err().print(f"the run goes on in allocation {len(record.allocations) + 1}: following its tasks there")
        code = _print_parts(logs_parts(store, record, ask.replace(tail=None, since=None)))
    return code


def _print_parts(parts: Iterator[LogsPart]) -> int:
    """Print `logs` as `rpc_handlers.logs_parts` makes it, here or in the run's live controller:
    text, notes on TF patterns that last, the readers' errors."""
    from tfctl import console

    errors: list[str] = []
    try:
        for part in parts:
            if part.text:
                sys.stdout.write(part.text)
                sys.stdout.flush()
            for note in part.notes:
                from tfctl.controller.views.status_table import note_text

                console.err().print(note_text(note.task, note.cause, note.fix))
            errors += part.errors
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        getattr(parts, "close", lambda: None)()  # stop reading now, not when collected
    for problem in errors:
        console.err().print(problem, style="red", markup=False)
    return 1 if errors else 0


@cli.command(
    short_help="Write a run's or a sweep's report: one offline HTML page.",
    epilog="""\b
Examples:
  tfctl report                     the newest run, to ./RUN_ID.html
  tfctl report --run ID -o r.html  that run, to r.html
  tfctl report -o - | gzip >r.gz   the page on stdout
  tfctl report --sweep             the newest sweep, to ./SWEEP_ID.html
  tfctl report --sweep ID --metric loss --min  its loss curves, least first""",
)
@file_option()
@run_option
@click.option(
    "--sweep",
    "sweep_id",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[SWEEP]",
    help="Report on SWEEP (default: the file's newest sweep): its trials' table and one chart of "
    "a metric's curve per trial.",
)
@click.option(
    "--metric",
    default=None,
    metavar="NAME",
    help="With --sweep: chart and rank by this metric (default: accuracy, else loss).",
)
@click.option("--min", "smallest", is_flag=True, help="With --sweep: the smallest is best (as sweep status --min).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default=None,
    help="Write the page here (default: ./RUN_ID.html or ./SWEEP_ID.html; - for stdout).",
)
@click.pass_context
def report(
    ctx: click.Context,
    cluster_file: Path | None,
    run_id: str | None,
    sweep_id: str | None,
    metric: str | None,
    smallest: bool,
    output: Path | None,
) -> int:
    """One HTML page of a run, asked of its hosts: its facts, a timeline of every task (start,
    listening, first step, restarts, end and how), steps/s over time, and the diagnosis. With
    --sweep, one page of a sweep: its facts, its trials ranked as `sweep status --sort` ranks
    them (the best marked, each linked to its run's report), and the metric's curve of every
    trial on one chart. It fetches nothing, so it opens offline and can be mailed."""
    from tfctl import console
    from tfctl.api.handle import Run, report_page

    if sweep_id is not None:
        if run_id is not None:
            raise UsageError("--sweep reports on a sweep, --run on a run", hint="give one of them")
        return _sweep_report(ctx, cluster_file, sweep_id, metric, smallest, output)
    if metric is not None or smallest:
        raise UsageError("--metric and --min choose a sweep's chart", hint="add --sweep [ID]")
    record = run_record(ctx, cluster_file, run_id, resume=False)
    if str(output) == "-":
        sys.stdout.write(report_page(record))
        return 0
    path = Run(record.run_id, run_store().home).report(output or Path(f"{record.run_id}.html"))
    console.err().print(f"report of {record.run_id} written to {path}")
    return 0


def _sweep_report(
    ctx: click.Context,
    cluster_file: Path | None,
    sweep_id: str,
    metric: str | None,
    smallest: bool,
    output: Path | None,
) -> int:
    """`report --sweep`: the page beside the trials' run reports it links to (stdout: here)."""
    from tfctl import console
    from tfctl.api.handle import write_page
    from tfctl.cli.common import cluster_file_path
    from tfctl.controller.verbs.sweep_page import gather_sweep
    from tfctl.controller.views.sweep_report import render
    from tfctl.runs.sweeps import SweepStore

    sweeps = SweepStore(run_store())
    record = sweeps.resolve(sweep_id or None, "" if sweep_id else str(cluster_file_path(ctx, cluster_file).resolve()))
    to_stdout = str(output) == "-"
    target = output if output is not None and not to_stdout else Path(f"{record.sweep_id}.html")
    page = render(gather_sweep(sweeps, record, metric, smallest, Path(".") if to_stdout else target.parent))
    if to_stdout:
        sys.stdout.write(page)
        return 0
    write_page(target, page)
    console.err().print(f"report of {record.sweep_id} written to {target}", markup=False)
    return 0
