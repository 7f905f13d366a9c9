"""`tfctl report --sweep`'s page: a sweep's facts, its trials' table and one chart of the chosen
metric, a curve per trial, as one self-contained HTML string.

Pure, as `report.py` is (`sweep_gather` asks the hosts), and drawn with its pieces: the same
escaping, page, style and `line_chart`, on a scale of steps instead of times. Parameter values
and what the tasks printed are hostile: every one goes through `report.text`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tfctl.controller.views.report import (
    CSP,
    LABEL,
    PAGE,
    STYLE,
    WIDTH,
    Scale,
    clock,
    colour_of,
    line_chart,
    offset,
    text,
)
from tfctl.runs.accounting import hours_text
from tfctl.runs.record import params_text

BEST = "&#9733;"  # the best trial's mark in its row and in the legend


@dataclass(frozen=True)
class TrialRow:
    """One trial: its `sweep status` row, and its curve of the page's metric."""

    index: int
    params: Mapping[str, Any]
    state: str  # pending, running, succeeded, failed, stopped
    state_text: str  # `failed: worker:0 exited with code 3`
    metrics: Mapping[str, str] = field(default_factory=dict)  # name -> `0.97 @600`, its run's result
    wall_seconds: float | None = None
    gpu_hours: float | None = None
    run_id: str | None = None  # its newest run
    curve: tuple[tuple[float, float], ...] = ()  # (step, value), as its run's chief (else worker 0) logged them
    no_curve: str = ""  # why it has none: "not started yet", "its run logged no accuracy with a step"
    report: str | None = None  # its run's report beside the page (a relative address); None: none written
    make_report: str = ""  # the command that writes it there


@dataclass(frozen=True)
class SweepReport:
    sweep_id: str
    cluster_name: str
    cluster_file: str
    state: str
    reason: str | None
    max_parallel: int
    retries: int
    created_at: float
    ended_at: float | None
    generated_at: float
    trials: tuple[TrialRow, ...]  # ranked as `sweep status --sort METRIC [--min]`, best first
    metric: str | None  # charted and ranked by; None: no trial logged any
    smallest: bool = False  # the smallest `metric` is best
    best: int | None = None  # the best trial's index
    overrides: tuple[tuple[str, str], ...] = ()  # `sweep --set`, for every trial
    metrics: tuple[str, ...] = ()  # every metric some trial's result has: the table's columns
    why_metric: str = ""  # how `metric` was chosen, when it was not asked for


class StepScale(Scale):
    """Steps -> x pixels; grid lines at round steps, labelled with the step."""

    def ticks(self, count: int = 6) -> list[float]:
        step = round_step((self.end - self.start) / count)
        first = math.ceil(self.start / step) * step
        return [first + i * step for i in range(int((self.end - first) / step) + 1)]

    def label(self, tick: float, origin: float) -> str:
        return f"{tick:g}"


def round_step(rough: float) -> float:
    """1, 2 or 5 times a power of ten, the first at least `rough`."""
    power = 10.0 ** math.floor(math.log10(max(rough, 1e-9)))
    return next(k * power for k in (1, 2, 5, 10) if k * power >= rough)


def render(sweep: SweepReport) -> str:
    """The whole page."""
    body = [facts(sweep), trials_table(sweep), chart(sweep)]
    return PAGE.format(
        title=text(f"tfctl report {sweep.sweep_id}"), csp=CSP, style=STYLE + SWEEP_STYLE, body="\n".join(body)
    )


def ranking(sweep: SweepReport) -> str:
    """`accuracy, the largest first (as tfctl sweep status ID --sort accuracy)`."""
    if sweep.metric is None:
        return "trial order: no trial logged a metric"
    order = "the smallest first" if sweep.smallest else "the largest first"
    command = f"tfctl sweep status {sweep.sweep_id} --sort {sweep.metric}{' --min' if sweep.smallest else ''}"
    chosen = f"; {sweep.why_metric}" if sweep.why_metric else ""
    return f"{sweep.metric}, {order} (as {command}){chosen}"


def facts(sweep: SweepReport) -> str:
    counts = Counter(row.state for row in sweep.trials)
    trials = f"{len(sweep.trials)}: " + ", ".join(f"{n} {state}" for state, n in counts.most_common())
    best = [row for row in sweep.trials if row.index == sweep.best]
    rows = [
        ("sweep", sweep.sweep_id),
        ("cluster", f"{sweep.cluster_name} ({sweep.cluster_file})"),
        ("state", sweep.state + (f": {sweep.reason}" if sweep.reason else "")),
        ("trials", trials),
        ("max_parallel", str(sweep.max_parallel)),
        ("retries", str(sweep.retries)),
        *([("set for every trial", params_text(dict(sweep.overrides)))] if sweep.overrides else []),
        ("ranked by", ranking(sweep)),
        *([("best", f"trial {best[0].index}: {trial_name(best[0])}")] if best else []),
        ("started", clock(sweep.created_at)),
        ("ended", clock(sweep.ended_at) if sweep.ended_at else "not yet"),
        ("duration", offset((sweep.ended_at or sweep.generated_at) - sweep.created_at).lstrip("+")),
        ("GPU-hours", gpu_total(sweep.trials)),
        ("report made", clock(sweep.generated_at)),
    ]
    cells = "".join(f"<tr><th>{text(k)}</th><td>{text(v)}</td></tr>" for k, v in rows)
    return f"<h1>{text(sweep.sweep_id)}</h1><table class=facts>{cells}</table>"


def gpu_total(trials: Sequence[TrialRow]) -> str:
    hours = [row.gpu_hours for row in trials if row.gpu_hours is not None]
    return hours_text(sum(hours)) + " (the trials' newest runs)" if hours else "not measured"


def trial_name(row: TrialRow) -> str:
    """What the legend calls a trial: its parameters (`trial 3` for a trial without any)."""
    return params_text(row.params) or f"trial {row.index}"


def trials_table(sweep: SweepReport) -> str:
    """A row per trial, best first: its colour in the chart, parameters, state, each final
    metric (@ its step), wall time, GPU-hours, its run and that run's report."""
    names = list(dict.fromkeys(name for row in sweep.trials for name in row.params))
    head = ["trial", *names, "state", *sweep.metrics, "wall", "GPU-h", "run", "run report"]
    rows = []
    for row in sweep.trials:
        best = row.index == sweep.best
        mark = f' <b class="best" title="best">{BEST} best</b>' if best else ""
        colour = colour_of(row.index) if row.curve else "transparent"
        cells = [
            f'<span style="color:{colour}">&#9632;</span> {row.index}{mark}',
            *(text(row.params.get(name, "")) for name in names),
            text(row.state_text),
            *(text(row.metrics.get(name) or "-") for name in sweep.metrics),
            "-" if row.wall_seconds is None else offset(row.wall_seconds).lstrip("+"),
            hours_text(row.gpu_hours) if row.gpu_hours else "-",
            text(row.run_id or "-"),
            report_cell(row),
        ]
        kinds = ["n", *("wrap p" for _ in names), "end", *("n" for _ in sweep.metrics), "n", "n", "n", "wrap"]
        tds = "".join(f'<td class="{k}">{c}</td>' for k, c in zip(kinds, cells))
        rows.append(f'<tr class="{"best" if best else "trial"}" id="trial-{row.index}">{tds}</tr>')
    heads = "".join(f"<th>{text(h)}</th>" for h in head)
    return f"<h2>Trials</h2><table class=tasks><tr>{heads}</tr>{''.join(rows)}</table>"


def report_cell(row: TrialRow) -> str:
    if row.report is not None:
        return f'<a href="{text(row.report)}">{text(row.report)}</a>'
    if row.make_report:
        return f"none yet: <code>{text(row.make_report)}</code>"
    return "-"


def chart(sweep: SweepReport) -> str:
    """The metric's curve of every trial that logged it, value by step, one colour each, and
    the trials without one listed under it with the reason."""
    if sweep.metric is None:
        return (
            '<h2>Curves</h2><p class="none">No trial logged a metric tfctl could read (see metrics: in the README).</p>'
        )
    by_index = sorted(sweep.trials, key=lambda row: row.index)
    drawn = [row for row in by_index if row.curve]
    missing = [row for row in by_index if not row.curve]
    head = f"<h2>{text(sweep.metric)} by step</h2>"
    told = "".join(
        f"<li>trial {row.index} ({text(trial_name(row))}): {text(row.no_curve or 'no curve')}</li>" for row in missing
    )
    without = f'<p class="note">No {text(sweep.metric)} curve for:</p><ul class=none>{told}</ul>' if missing else ""
    if not drawn:
        return head + f'<p class="none">No trial logged {text(sweep.metric)} with a step.</p>' + without
    steps = [step for row in drawn for step, _ in row.curve]
    scale = StepScale(min(steps), max(steps), LABEL, WIDTH - 10)
    series = [(legend_name(sweep, row), row.curve) for row in by_index]  # every trial: colour i is trial i's
    note = (
        f'<p class="note">x: the step each {text(sweep.metric)} line names; a curve per trial, from the '
        "chief's or else worker 0's lines; the table's figures are the final evaluation's.</p>"
    )
    return head + line_chart(series, scale, sweep.metric, 0.0) + note + without


def legend_name(sweep: SweepReport, row: TrialRow) -> str:
    best = " \u2605 best" if row.index == sweep.best else ""
    return f"trial {row.index}: {trial_name(row)}{best}"


SWEEP_STYLE = """
table.tasks tr.best td { background: #fff4cc; } b.best { color: #9a6b00; }
a { color: #1f4e9a; } code { font-size: 11px; } td.p { min-width: 5em; } td.end { overflow-wrap: anywhere; }
"""
