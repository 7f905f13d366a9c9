"""Shell completion of run ids, task names and templates, from local files only.

A shell calls these on every Tab, so they read the run store and nothing else (no SSH, no
cluster-file parsing) and never fail loudly: any problem completes nothing, rather than printing
a traceback into the user's command line.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import click
from click.shell_completion import CompletionItem

from tfctl.cli.common import DEFAULT_FILE, named_file

Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


def quietly(complete: Completer) -> Completer:
    """`complete`, with any failure completing nothing."""

    def safe(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            return complete(ctx, param, incomplete)
        except Exception:  # noqa: BLE001 - a traceback would land in the user's shell
            return []

    return safe


@quietly
def run_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Every run this machine remembers, newest first, with its state and start time."""
    from tfctl.runs.store import RunStore

    return [
        CompletionItem(
            r.run_id, help=f"{r.state.value}, started {time.strftime('%Y-%m-%d %H:%M', time.localtime(r.created_at))}"
        )
        for r in reversed(RunStore().all())
        if r.run_id.startswith(incomplete)
    ]


@quietly
def task_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Jobs and tasks of the run the command would pick: --run, else the newest run of the
    cluster file (named, or ./cluster.yaml); ones already on the command line are left out."""
    from tfctl.runs.store import RunStore

    store = RunStore()
    run_id = ctx.params.get("run_id")
    if run_id:
        record = store.load(run_id)
    else:
        found = store.latest(Path(named_file(ctx, ctx.params.get("cluster_file")) or DEFAULT_FILE), None)
        if found is None:
            return []
        record = found
    given = set(ctx.params.get(param.name or "", ()) or ())
    items = [CompletionItem(job, help="every task of the job") for job in dict.fromkeys(t.job for t in record.tasks)]
    items += [CompletionItem(t.name, help=f"on {t.address}") for t in record.tasks]
    return [i for i in items if i.value.startswith(incomplete) and i.value not in given]


@quietly
def template_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from tfctl.tf import templates

    return [CompletionItem(n, help=title) for n, title in templates.available().items() if n.startswith(incomplete)]


run_option = click.option(
    "--run", "run_id", shell_complete=run_ids, help="Run id (default: the newest run of the cluster file)."
)
