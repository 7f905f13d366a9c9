"""`tfctl down`: stop a run (and with --all, what dead runs left) and prove nothing remains."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tfctl.cli.app import cli
from tfctl.cli.common import cluster_file_path, file_option, run_record, run_store
from tfctl.cli.complete import run_option
from tfctl.errors import UsageError

if TYPE_CHECKING:
    from tfctl.runs.store import RunStore


@cli.command(
    short_help="Stop every process of a run and prove nothing remains.",
    epilog="""\b
Examples:
  tfctl down                 stop the newest run of ./cluster.yaml
  tfctl down --run ID        stop that run (ids: tfctl runs)
  tfctl down --all           also stop what crashed runs left on the hosts
  tfctl down --sweep ID      stop every trial of that sweep""",
)
@file_option()
@run_option
@click.option("--sweep", "sweep_id", default=None, metavar="SWEEP", help="Stop the sweep: every trial of it.")
@click.option(
    "--all",
    "reap",
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
def down(
    ctx: click.Context,
    cluster_file: Path | None,
    run_id: str | None,
    sweep_id: str | None,
    reap: bool,
    grace: float | None,
) -> int:
    """Stop every process of the run on every host, then prove nothing remains."""
    from tfctl import console
    from tfctl.cli import render
    from tfctl.controller.verbs import down

    store = run_store()
    if sweep_id is not None:
        if run_id or reap:
            raise UsageError("--sweep stops the trials of a sweep", hint="give --run or --all in another `down`")
        return down_sweep(store, sweep_id)
    typed_at = time.time()
    try:
        record = run_record(ctx, cluster_file, run_id, resume=False, queued=True)
    except UsageError:
        if not reap:
            raise
        record = None
    clean = True
    stopped: set[str] = set()
    while record is not None and record.run_id not in stopped:
        report, released = down.down(store, record, grace)
        stopped.add(record.run_id)
        console.err().print(f"run {record.run_id}:", markup=False)
        render.render_stop(report)
        clean = clean and report.clean
        if released is not None:
            console.err().print(released.line(), markup=False)
            clean = clean and released.ended
        # An `up` typed before this `down` may have recorded its run only meanwhile: it is the
        # run being started, and stopped too.
        newer = None if run_id else run_record(ctx, cluster_file, None, resume=False, queued=True)
        record = newer if newer is not None and newer.active and newer.created_at <= typed_at else None
    if reap:
        from tfctl.config.loader import load_config
        from tfctl.controller.start.plan import host_specs

        if record is not None:
            hosts, default_grace = record.hosts, record.grace_period
        else:
            config = load_config(cluster_file_path(ctx, cluster_file))
            hosts, default_grace = host_specs(config), config.grace_period
        for host, answer in down.reap_orphans(store, hosts, default_grace if grace is None else grace).items():
            runs = ", ".join(answer.runs) or "none"
            boxes = f" and {answer.containers} containers" if answer.containers else ""
            console.err().print(
                f"{host}: {answer.processes} orphaned processes{boxes} stopped (runs: {runs}); "
                f"{len(answer.remaining)} remain",
                markup=False,
            )
            clean = clean and not answer.remaining
    return 0 if clean else 1


def down_sweep(store: RunStore, sweep_id: str) -> int:
    """Every trial of the sweep stopped (its driver first, so none starts after), each proved."""
    from tfctl import console
    from tfctl.cli import render
    from tfctl.controller.verbs import sweep as verbs
    from tfctl.runs.sweeps import SweepStore

    sweeps = SweepStore(store)
    stopped = verbs.stop(sweeps, sweeps.load(sweep_id), time.time())
    clean = True
    for run, report in stopped:
        console.err().print(f"run {run.run_id} (trial {run.trial}):", markup=False)
        if report is not None:
            render.render_stop(report)
            clean = clean and report.clean
        else:  # its sweep's driver stopped it, and recorded what the stop proved
            proved = "nothing of it left on any host" if run.left_nothing else "not proved: see `tfctl status`"
            console.err().print(f"{run.state} by the sweep's driver; {proved}", markup=False)
            clean = clean and run.left_nothing
    ended = sweeps.load(sweep_id)
    console.err().print(
        f"sweep {sweep_id}: {ended.state} ({ended.reason}); {len(stopped)} trials stopped", markup=False
    )
    return 0 if clean else 1
