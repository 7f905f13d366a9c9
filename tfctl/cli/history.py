"""`tfctl runs`: the runs this machine remembers."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import click

from tfctl.cli.app import cli
from tfctl.cli.common import (
    run_store,
)

if TYPE_CHECKING:
    pass


@cli.command(
    name="runs",
    short_help="List the runs tfctl remembers.",
    epilog="""\b
Examples:
  tfctl runs                 every run, newest last
  tfctl runs --json          the same as a JSON list""",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def runs_command(as_json: bool) -> int:
    """List the runs tfctl remembers, newest last."""
    from tfctl import console

    records = run_store().all()
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
