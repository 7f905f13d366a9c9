"""What `tfctl report --sweep` draws, gathered when it is asked for: the sweep's record, its
trials' rows as `sweep status` reads them (`sweep.results`, `ranked`), and each trial's curves
from its newest run's hosts, read as the run report reads a task's (`whole_run`,
`model_numbers`): the same marks, the same steps, the same numbers. The page itself is
`views/sweep_report.py`'s.

A trial's curve is one task's: the chief's, else worker 0's, as its run's result is
(`results.rank`). A trial without one (not started, unreachable, logged none) stays on the
page, saying why.
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from tfctl.cluster.cluster import Cluster
from tfctl.controller.verbs.sweep import TrialResult, best_of, metric_text, ranked, results
from tfctl.controller.views.report_gather import model_numbers, whole_run
from tfctl.controller.views.sweep_report import SweepReport, TrialRow
from tfctl.engine.sweeping import TrialState
from tfctl.errors import TfctlError, UsageError
from tfctl.runs.store import RunStore
from tfctl.runs.sweeps import SweepRecord, SweepStore
from tfctl.tf.progress import RunProgress
from tfctl.tf.results import rank

DEFAULT_METRICS = ("accuracy", "loss")  # charted when none is asked for (`sweep status` sorts by none)
AT_ONCE = 4  # trials' hosts asked at once


@dataclass(frozen=True)
class Curves:
    """One trial's curves: name -> (step, value), oldest first, of the first task that logged it."""

    by_name: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    why: str = ""  # why there are none at all ("" : its run was asked)


def gather_sweep(
    sweeps: SweepStore,
    sweep: SweepRecord,
    metric: str | None = None,
    smallest: bool = False,
    folder: Path = Path("."),
) -> SweepReport:
    """The page of `sweep`, its trials ranked by `metric` (default: accuracy, else loss) as
    `sweep status --sort` ranks them; each row links to its run's report where one was written
    into `folder` (the page's, as the user named it) under its default name, `RUN_ID.html`."""
    now = time.time()
    trials = results(sweeps, sweep)
    with ThreadPoolExecutor(max_workers=max(1, min(AT_ONCE, len(trials))), thread_name_prefix="trial") as pool:
        curves = list(pool.map(lambda row: trial_curves(sweeps.runs, row), trials))
    chosen, why = chosen_metric(sweep, metric, trials, curves)
    smallest = smallest or (metric is None and chosen == "loss")
    order = ranked(trials, chosen, smallest)
    rows = [trial_row(row, curves[row.index], chosen, folder) for row in order]
    return SweepReport(
        sweep_id=sweep.sweep_id,
        cluster_name=sweep.cluster_name,
        cluster_file=sweep.cluster_file,
        state=sweep.state.value,
        reason=sweep.reason,
        max_parallel=sweep.max_parallel,
        retries=sweep.retries,
        created_at=sweep.created_at,
        ended_at=sweep.ended_at,
        generated_at=now,
        trials=tuple(rows),
        metric=chosen,
        smallest=smallest,
        best=best_of(order, chosen),
        overrides=tuple(sweep.overrides.items()),
        metrics=tuple(dict.fromkeys(name for row in trials for name in row.metrics)),
        why_metric=why,
    )


def chosen_metric(
    sweep: SweepRecord, asked: str | None, trials: list[TrialResult], curves: list[Curves]
) -> tuple[str | None, str]:
    """The metric the page charts and ranks by, and how it was chosen ("" : asked for). One no
    trial has, in its result or its lines, is refused, naming those they have."""
    seen = list(dict.fromkeys([n for row in trials for n in row.metrics] + [n for c in curves for n in c.by_name]))
    if asked is not None:
        if asked not in seen:
            raise UsageError(
                f"no trial of sweep {sweep.sweep_id} logged a metric {asked!r}",
                hint=f"its trials logged {', '.join(seen)}" if seen else "its trials have logged no metric yet",
            )
        return asked, ""
    default = next((name for name in DEFAULT_METRICS if name in seen), seen[0] if seen else None)
    if default is None:
        return None, ""
    return default, f"the default ({' else '.join(DEFAULT_METRICS)}); --metric NAME charts another"


def trial_curves(store: RunStore, row: TrialResult) -> Curves:
    """The curves of the trial's newest run, asked of its hosts: per name, the first task (chief,
    worker 0, ...) whose lines give it with a step."""
    if row.run_id is None:
        return Curves(why="not started yet" if row.state is TrialState.PENDING else row.state_text())
    record = store.load(row.run_id)
    progress = RunProgress(record.progress)
    try:
        with Cluster(record) as cluster:
            statuses, unreachable = cluster.status(progress=whole_run(record, progress, time.time()))
    except TfctlError as e:
        return Curves(why=f"its hosts could not be asked: {e.message}")
    found: dict[str, tuple[tuple[float, float], ...]] = {}
    for s in sorted(statuses, key=lambda s: (rank(s.job), s.index)):
        for name, points in model_numbers(s.marks, progress.reader, progress.results):
            curve = tuple((float(step), v) for _, step, v in points if step is not None and math.isfinite(v))
            if curve and name not in found:
                found[name] = curve
    if not found and unreachable:
        return Curves(
            why="its hosts could not be asked: "
            + "; ".join(f"{h}: {getattr(e, 'message', e)}" for h, e in sorted(unreachable.items()))
        )
    return Curves(found)


def trial_row(row: TrialResult, curves: Curves, metric: str | None, folder: Path) -> TrialRow:
    """The trial's row of the page: its `sweep status` figures, its curve of `metric` (or why it
    has none) and its run's report in `folder`, or the command that writes it there."""
    curve = curves.by_name.get(metric or "", ())
    if curve:
        why = ""
    elif curves.why:
        why = curves.why
    else:
        logged = ", ".join(curves.by_name)
        why = f"its run {'has logged' if row.state is TrialState.RUNNING else 'logged'} no {metric} with a step"
        why += f" (it logged {logged})" if logged else ""
    shown = TrialRow(
        index=row.index,
        params=row.params,
        state=row.state.value,
        state_text=row.state_text(),
        metrics={name: metric_text(row, name) for name in row.metrics},
        wall_seconds=row.wall_seconds,
        gpu_hours=row.gpu_hours,
        run_id=row.run_id,
        curve=curve,
        no_curve=why,
    )
    if row.run_id is None:
        return shown
    name = f"{row.run_id}.html"
    command = f"tfctl report --run {row.run_id}" + ("" if folder == Path(".") else f" -o {folder / name}")
    return dataclasses.replace(shown, report=quote(name) if (folder / name).is_file() else None, make_report=command)
