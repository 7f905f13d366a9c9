"""`tfctl submit`, `tfctl queue`, `tfctl cancel`, and the queue's driver (`tfctl _queue`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tfctl.cli.app import cli
from tfctl.cli.common import cluster_file_path, file_option, run_record, run_store, set_option
from tfctl.cli.complete import run_ids, run_option
from tfctl.errors import UsageError

if TYPE_CHECKING:
    from tfctl.controller.verbs.queue import QueueView


@cli.command(
    short_help="Queue a run on the file's pool; it starts when room frees.",
    epilog="""\b
Examples:
  tfctl submit                    queue a run of ./cluster.yaml; prints its id
  tfctl submit --priority 5       ahead of every run of priority below 5
  tfctl -f sweep.yaml submit --set lr=0.1
  tfctl queue                     where it stands, and why it waits""",
)
@file_option()
@set_option
@click.option("--priority", type=int, default=0, show_default=True, help="Higher starts first.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's id and state as JSON.")
@click.pass_context
def submit(
    ctx: click.Context, cluster_file: Path | None, assignments: tuple[str, ...], priority: int, as_json: bool
) -> int:
    """Record a run of the cluster file as queued and return at once. The queue's driver (a
    process of yours that outlives this terminal) starts it on the file's `pool:` as soon as
    the pool has room, by priority, then sharing the pool fairly between users, then by
    submission order; it then runs as a detached `up` does. A run that could never fit on the
    pool is refused here, with the reason."""
    from tfctl import console
    from tfctl.api.queueing import submit as submit_run
    from tfctl.config.params import overrides

    store = run_store()
    run = submit_run(
        cluster_file_path(ctx, cluster_file), priority=priority, params=overrides(assignments), home=store.home
    )
    record = store.load(run.id)
    if as_json:
        console.out().print_json(json.dumps({"run_id": record.run_id, "state": record.state.value}))
    else:
        console.out().print(record.run_id, markup=False, highlight=False)
        console.err().print(f"queued on pool {Path(record.pool or '').stem}: `tfctl queue` shows where it stands")
    return 0


@cli.command(
    name="queue",
    short_help="Show queued, running and recently ended runs.",
    epilog="""\b
Examples:
  tfctl queue           each run's place, state, and why it waits
  tfctl queue --json    the same, as JSON""",
)
@click.option("--json", "as_json", is_flag=True, help="Print the queue as JSON.")
def queue_command(as_json: bool) -> int:
    """Your queued runs in the order they start, with why each waits ("needs 2 GPUs on one
    host; the most free on any host is 1"), then your running runs and those ended in the last
    hour. Says which process starts the runs, and starts it again if it is gone."""
    from tfctl import console
    from tfctl.controller.verbs.queue import queue_view

    view = queue_view(run_store())
    if as_json:
        console.out().print_json(json.dumps(view.to_json()))
    else:
        render(view)
    return 0


@cli.command(
    short_help="Take queued runs out; stop running ones (a down).",
    epilog="""\b
Examples:
  tfctl cancel ID             take run ID out of the queue (or stop it)
  tfctl cancel ID1 ID2        several at once
  tfctl cancel --run ID       the same as `tfctl cancel ID`
  tfctl cancel --sweep ID     every trial of that sweep""",
)
@click.argument("run_ids", nargs=-1, shell_complete=run_ids)
@file_option()
@run_option
@click.option("--sweep", "sweep_id", default=None, metavar="SWEEP", help="Cancel the sweep: every trial of it.")
@click.option("--json", "as_json", is_flag=True, help="Print what became of each run as JSON.")
@click.pass_context
def cancel(
    ctx: click.Context,
    run_ids: tuple[str, ...],
    cluster_file: Path | None,
    run_id: str | None,
    sweep_id: str | None,
    as_json: bool,
) -> int:
    """Take each queued run out of the queue; a run that already started is stopped, as `tfctl
    down` stops it, with its proof. With no id, the cluster file's newest run; with --sweep,
    every trial of the sweep, as `tfctl down --sweep`."""
    from tfctl import console
    from tfctl.cli import render as show
    from tfctl.controller.verbs import down
    from tfctl.supervisor.protocol import RunState

    store = run_store()
    if sweep_id is not None:
        from tfctl.cli.stop import down_sweep

        if run_ids or run_id:
            raise UsageError("--sweep cancels the trials of a sweep", hint="give run ids in another `cancel`")
        return down_sweep(store, sweep_id)
    wanted = [*run_ids, *([run_id] if run_id else [])]
    records = [run_record(ctx, None, i, resume=False, queued=True) for i in wanted] or [
        run_record(ctx, cluster_file, None, resume=False, queued=True)
    ]
    said: list[dict[str, object]] = []
    clean = True
    for record in records:
        if not record.active:
            said.append({"run_id": record.run_id, "result": "ended already", "state": record.state.value})
            continue
        was_queued = record.state is RunState.QUEUED
        report, _released = down.down(store, record, None)
        now = store.load(record.run_id)
        result = "cancelled" if was_queued and now.reason == "cancelled while queued" else "stopped"
        said.append({"run_id": record.run_id, "result": result, "state": now.state.value, "clean": report.clean})
        clean = clean and report.clean
        if not as_json:
            console.err().print(f"run {record.run_id}: {result}", markup=False)
            if result == "stopped":
                show.render_stop(report)
    if as_json:
        console.out().print_json(json.dumps({"runs": said}))
    elif any(s["result"] == "ended already" for s in said):
        for s in said:
            if s["result"] == "ended already":
                console.err().print(f"run {s['run_id']}: ended already ({s['state']})", markup=False)
    return 0 if clean else 1


@cli.command(name="_queue", hidden=True)
def queue_driver() -> int:
    """The queue's driver: starts queued runs as their pools have room, ends once none wait."""
    from tfctl.controller.queue.driver import QueueDriver

    QueueDriver(run_store()).run()
    return 0


def render(view: QueueView) -> None:
    """One line per run; then who starts them."""
    from rich.table import Table

    from tfctl import console
    from tfctl.supervisor.states import RunState

    table = Table(box=None, pad_edge=False)
    for column in ("#", "RUN", "STATE", "PRIORITY", "SUBMITTED", "WHY / WHERE"):
        table.add_column(column, overflow="fold")
    for row in view.rows:
        r = row.record
        if r.state is RunState.QUEUED:
            detail = row.why or "waiting for the driver's first look"
        elif r.active:
            detail = ", ".join(f"{p.task} on {p.host}" for p in r.placement)
        else:
            detail = r.reason or ""
        place = str(row.position) if row.position is not None else ""
        when = time.strftime("%H:%M:%S", time.localtime(r.created_at))
        table.add_row(place, r.run_id, r.state.value, str(r.priority or 0), when, detail)
    err = console.err()
    if view.rows:
        console.out().print(table)
    else:
        err.print("no queued, running or recently ended runs: `tfctl submit` queues one")
    for user, count in sorted(view.look.others.items()):
        err.print(f"also waiting on the same hosts: {count} run{'s' if count != 1 else ''} of {user}", markup=False)
    if view.started_driver:
        err.print(f"no process was starting the queued runs: started the queue's driver again (pid {view.driver})")
    elif view.driver is not None:
        err.print(f"the queue's driver is pid {view.driver}; its log: $TFCTL_HOME/queue/driver.log")
    elif any(row.record.state is RunState.QUEUED for row in view.rows):
        err.print("no process is starting the queued runs; any tfctl command starts it again")
