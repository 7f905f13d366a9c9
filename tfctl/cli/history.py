"""`tfctl runs`: the runs this machine remembers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from tfctl.cli.app import cli
from tfctl.cli.common import DEFAULT_FILE, file_option, named_file, run_store


@cli.command(
    name="runs",
    short_help="List the runs tfctl remembers.",
    epilog="""\b
Examples:
  tfctl runs                 the runs of ./cluster.yaml (or all, without one)
  tfctl runs -f gpu.yaml     the runs of gpu.yaml (or: tfctl -f gpu.yaml runs)
  tfctl runs --all --json    every run, as a JSON list""",
)
@file_option()
@click.option("--all", "every", is_flag=True, help="Every run, whatever the cluster file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def runs_command(ctx: click.Context, cluster_file: Path | None, every: bool, as_json: bool) -> int:
    """List the runs of the cluster file (-f, else ./cluster.yaml), newest last; with no file
    given and no ./cluster.yaml, or with --all, every run tfctl remembers."""
    from tfctl import console

    path = None if every else named_file(ctx, cluster_file) or (DEFAULT_FILE if DEFAULT_FILE.exists() else None)
    records = run_store().all()
    if path is not None:
        wanted = str(path.resolve())
        records = [r for r in records if r.cluster_file == wanted]
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
                        "ended_at": r.ended_at,
                        "reason": r.reason,
                    }
                    for r in records
                ]
            )
        )
        return 0
    if not records and path is not None:
        console.err().print(f"no runs of {path} (tfctl runs --all lists every run)", markup=False)
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at))
        console.out().print(f"{r.run_id:<40} {when}  {r.state.value:<10} {r.reason or ''}", markup=False)
    return 0
