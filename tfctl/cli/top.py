"""`tfctl top`: what every task of a run uses, live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from tfctl.cli.app import cli
from tfctl.cli.common import file_option, run_record
from tfctl.cli.complete import run_option
from tfctl.cli.inspect import status_asker

SORT_KEYS = ("cpu", "mem", "gpu", "rate", "task")  # as `controller.top_view.SORTS` names them


@cli.command(
    short_help="Show each task's CPU, memory, GPU and steps/s, live.",
    epilog="""\b
Examples:
  tfctl top                     refresh every 2 seconds until Ctrl-C
  tfctl top --sort rate         slowest task first
  tfctl top --once              print one screen and exit""",
)
@file_option()
@run_option
@click.option(
    "--sort",
    type=click.Choice(SORT_KEYS),
    default="cpu",
    show_default=True,
    help="Order: most CPU, memory or GPU first, slowest first (rate), or by name.",
)
@click.option(
    "--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True, help="Seconds between refreshes."
)
@click.option("--once", is_flag=True, help="Print one screen and exit (as when stdout is not a terminal).")
@click.pass_context
def top(
    ctx: click.Context, cluster_file: Path | None, run_id: str | None, sort: str, interval: float, once: bool
) -> int:
    """Every task's CPU (its whole process tree), resident memory, GPU utilisation and memory,
    and steps/s, with a minute of history; the slow or hungry task in red."""
    import sys

    from tfctl import console
    from tfctl.controller.rpc_messages import StatusAsk
    from tfctl.controller.top_view import HISTORY, top_view

    record = run_record(ctx, cluster_file, run_id)
    with status_asker(record) as ask:

        def screen() -> Any:
            return top_view(ask(StatusAsk(json=True, usage_history=HISTORY)).json or {}, sort)

        if once or not sys.stdout.isatty():
            console.out().print(screen())
            return 0
        from rich.live import Live

        with Live(screen(), console=console.out(), auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(screen(), refresh=True)
