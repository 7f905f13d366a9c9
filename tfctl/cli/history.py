"""`tfctl runs`: the runs this machine remembers, and `--prune` to forget old ones everywhere."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tfctl.cli.app import cli
from tfctl.cli.common import DEFAULT_FILE, Duration, file_option, named_file, run_store
from tfctl.errors import UsageError

if TYPE_CHECKING:
    from tfctl.controller.verbs.forget import PruneReport
    from tfctl.runs.record import RunRecord


@cli.command(
    name="runs",
    short_help="List the runs tfctl remembers; --prune old ones.",
    epilog="""\b
Examples:
  tfctl runs                   ./cluster.yaml's runs (all, if there is none)
  tfctl runs -f gpu.yaml       gpu.yaml's runs (or: tfctl -f gpu.yaml runs)
  tfctl runs --all --json      every run, as a JSON list
  tfctl runs --prune --dry-run what pruning would remove, on every host
  tfctl runs --prune --keep 3  keep the newest 3 ended runs of each file""",
)
@file_option()
@click.option("--all", "every", is_flag=True, help="Every run, whatever the cluster file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (with --prune: what was removed).")
@click.option(
    "--prune",
    is_flag=True,
    help="Remove old ended runs: their record here, and on their hosts their logs, task state, synced "
    "workdir and $TFCTL_RUN_DIR (checkpoints). Live runs are never touched.",
)
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    default=None,
    help="With --prune: keep the newest N ended runs of each cluster file (default: 10).",
)
@click.option(
    "--older-than",
    type=Duration(),
    default=None,
    help="With --prune: only runs that ended longer ago than this (30d, 12h, 1d12h).",
)
@click.option("--dry-run", is_flag=True, help="With --prune: print what would be removed; remove nothing.")
@click.pass_context
def runs_command(
    ctx: click.Context,
    cluster_file: Path | None,
    every: bool,
    as_json: bool,
    prune: bool,
    keep: int | None,
    older_than: float | None,
    dry_run: bool,
) -> int:
    """List the runs of the cluster file (-f, else ./cluster.yaml), newest last; with no file
    given and no ./cluster.yaml, or with --all, every run tfctl remembers."""
    from tfctl import console

    if not prune and (keep is not None or older_than is not None or dry_run):
        raise UsageError("--keep, --older-than and --dry-run go with --prune", hint="tfctl runs --prune --dry-run")
    path = None if every else named_file(ctx, cluster_file) or (DEFAULT_FILE if DEFAULT_FILE.exists() else None)
    records = run_store().all()
    if path is not None:
        wanted = str(path.resolve())
        records = [r for r in records if r.cluster_file == wanted]
    if prune:
        return _prune(records, keep, older_than, dry_run, as_json)
    if as_json:
        records = _settled(records)
        console.out().print_json(json.dumps([_record_json(r) for r in records]))
        return 0
    if not records and path is not None:
        console.err().print(f"no runs of {path} (tfctl runs --all lists every run)", markup=False)
    rows = [(r.run_id, _when(r.created_at), r.state.value, _how_it_ended(r)) for r in records]
    if rows:
        rows.insert(0, ("RUN", "STARTED", "STATE", "REASON"))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]  # sized to this listing's longest id
        for row in rows:
            line = "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[3]])
            console.out().print(line.rstrip(), markup=False)
    return 0


def _how_it_ended(r: RunRecord) -> str:
    return (
        (r.reason or "")
        + (f" (resumes {r.resumes})" if r.resumes else "")
        + (f" [{r.params_text()}]" if r.params else "")
    )


def _record_json(r: RunRecord) -> dict[str, object]:
    return {
        "run_id": r.run_id,
        "cluster": r.cluster_name,
        "file": r.cluster_file,
        "state": r.state.value,
        "created_at": r.created_at,
        "ended_at": r.ended_at,
        "reason": r.reason,
        "resumes": r.resumes,
        "accounting": r.accounting,  # what it cost, as its hosts counted when it was stopped
        "result": r.result,  # its final evaluation's numbers, read when it was stopped (null: not yet)
        "params": r.params,  # the cluster file's `params:` as the run had them
        "tracking": r.tracking_json(),  # its experiment tracker runs (`tracking:`)
    }


def _settled(records: list[RunRecord]) -> list[RunRecord]:
    """Scheduler figures kept unsettled (taken before the scheduler recorded the end) asked again."""
    from tfctl.runs.accounting import unsettled

    if not any(unsettled((r.accounting or {}).get(r.backend)) for r in records):
        return records  # the common case, without loading the controller
    from tfctl.controller.views.report_gather import settle_scheduler_figures

    store = run_store()
    return [settle_scheduler_figures(store, r) for r in records]


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _prune(records: list[RunRecord], keep: int | None, older_than: float | None, dry_run: bool, as_json: bool) -> int:
    from tfctl import console
    from tfctl.controller.verbs import forget as pruning

    keep = pruning.DEFAULT_KEEP if keep is None else keep
    chosen = pruning.candidates(records, keep, older_than, time.time())
    rule = f"beyond the newest {keep} ended runs of their cluster file" + (
        f", ended over {Duration.text(older_than)} ago" if older_than is not None else ""
    )
    if not chosen:
        if as_json:
            console.out().print_json(json.dumps({"dry_run": dry_run, "runs": [], "unreachable": {}}))
        else:
            live = sum(r.active for r in records)
            console.err().print(f"nothing to prune: no runs {rule} ({len(records)} runs, {live} live)", markup=False)
        return 0
    report = pruning.prune(run_store(), chosen, dry_run)
    if as_json:
        console.out().print_json(json.dumps(report.to_json()))
    else:
        _render(report, rule)
    return 0 if report.clean else 1


def _render(report: PruneReport, rule: str) -> None:
    from tfctl import console

    out, err = console.out(), console.err()
    verb = "would remove" if report.dry_run else "removed"
    for run in report.runs:
        r = run.record
        head = f"{r.run_id}  ({r.state.value}, started {_when(r.created_at)})"
        if run.complete:
            out.print(f"{head}: {verb} {_size(run.size)}", markup=False)
        else:
            out.print(f"{head}: kept, {'; '.join(run.problems)}", markup=False)
        for host, paths in run.paths.items():
            boxes = [f"container {name}" for name in run.containers.get(host, [])]
            out.print(f"  {host}: {', '.join(paths + boxes) or 'nothing left there'}", markup=False)
    done = [r for r in report.runs if r.complete]
    total = sum(r.size for r in report.runs)
    summary = f"{verb} {len(done)} of {len(report.runs)} runs {rule}: {_size(total)}"
    err.print(summary + (" (dry run: nothing was removed)" if report.dry_run else ""), markup=False)
    for host, why in sorted(report.unreachable.items()):
        err.print(f"error: {host} could not be reached: {why}", markup=False)
    kept = [r.record.run_id for r in report.runs if not r.complete]
    if kept and not report.dry_run:
        err.print(
            f"hint: the {len(kept)} runs kept keep their records too: run `tfctl runs --prune` again "
            "once their hosts answer, or once `tfctl down --run ID` stopped what still runs",
            markup=False,
        )


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    value = n / 1000
    for unit in ("KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
