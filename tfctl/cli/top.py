"""`tfctl top`: what every task of a run uses, live."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import click

from tfctl.cli.app import cli
from tfctl.cli.common import file_option, run_record, run_store
from tfctl.cli.complete import run_option

SORT_KEYS = ("cpu", "mem", "gpu", "rate", "task")  # as `controller.top_view.SORTS` names them


@cli.command(
    short_help="Show each task's CPU, memory, GPU and steps/s, live.",
    epilog="""\b
Examples:
  tfctl top                     refresh every 2 seconds; s sorts, q quits
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
    steps/s and last line, with a minute of history and per-job totals; the slow or hungry task
    in red. Keys while it runs: s sorts by the next column, P by CPU, M by memory, q quits."""
    import sys

    from tfctl import console
    from tfctl.controller.views.top_view import HISTORY, top_screen

    record = run_record(ctx, cluster_file, run_id)
    from tfctl.api.reading import status_asker

    with status_asker(run_store(), record) as ask:

        def fetch() -> dict[str, Any]:
            shot, latest = ask(HISTORY)
            return shot.to_json(latest, usage_history=True)

        out = console.out()
        if once or not sys.stdout.isatty():
            out.print(top_screen(fetch(), sort, out.width))
            return 0
        return _live(fetch, sort, interval)


def _live(fetch: Callable[[], dict[str, Any]], sort: str, interval: float) -> int:
    """Redraw every `interval` seconds with fresh numbers, and at once (from the numbers already
    fetched, asking no host) when a key changes the sort or the terminal its size."""
    import sys

    from rich.live import Live

    from tfctl import console
    from tfctl.controller.views.top_view import answer_key, top_screen

    out = console.out()
    data = fetch()
    with _keys(sys.stdin) as read_keys:

        def screen() -> Any:
            return top_screen(data, sort, out.width, out.height - 1, keys=sys.stdin.isatty())

        with Live(screen(), console=out, auto_refresh=False) as live:
            due = time.monotonic() + interval
            while True:
                wait = max(due - time.monotonic(), 0.0)
                for key in read_keys(wait):
                    answer = answer_key(key, sort)
                    if answer is None:
                        return 0
                    sort = answer
                if time.monotonic() >= due:
                    data, due = fetch(), time.monotonic() + interval
                live.update(screen(), refresh=True)


@contextlib.contextmanager
def _keys(stdin: TextIO) -> Iterator[Callable[[float], str]]:
    """Keys as they are pressed (cbreak: no Enter needed, Ctrl-C still interrupts), read without
    blocking longer than asked; the terminal's mode comes back however `top` ends. When stdin is
    no terminal, no key ever comes."""
    if not stdin.isatty():

        def wait(timeout: float) -> str:
            time.sleep(timeout)
            return ""

        yield wait
        return
    import select
    import termios
    import tty

    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)

    def read(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 64).decode(errors="replace") if ready else ""

    tty.setcbreak(fd)
    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
