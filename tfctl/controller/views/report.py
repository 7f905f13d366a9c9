"""`tfctl report`'s page: typed facts of a run in, one self-contained HTML string out.

Pure: nothing here asks a host or reads a file (`report_gather` does), so every piece can be
tested with made-up runs. The page fetches nothing (inline style, SVG drawn here, no script; its
Content-Security-Policy forbids the rest), so it opens offline and can be mailed. Task output is
hostile: every text that came from a task or a host is escaped, and its control characters
shown as `^[`, never passed on.
"""

from __future__ import annotations

import html
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from tfctl import console
from tfctl.runs.accounting import TaskCost, cost_json, hours_text
from tfctl.tf.results import Metric, result_text

WIDTH = 1100  # of every chart, in CSS pixels
LABEL = 190  # the task names' column of the timeline
ROW = 34  # one task's row of the timeline
BAR = 18  # the height of a run's bar in its row
CHART_HEIGHT = 220
FEW_RATES = 5  # fewer steps/s points than this in every series: the step itself is charted
TIMELINE_CHARS = 36  # of how a task ended, under its name in the timeline's column
# How a run of a task ended -> its bar's colour. Charts' lines use `PALETTE`, never these.
OUTCOME_COLOURS = {
    "succeeded": "#2ca02c",
    "failed": "#d62728",
    "stopped": "#e0a800",
    "running": "#1f77b4",
}
OTHER_OUTCOME = "#7f7f7f"  # lost, unreachable: how it ended is not known
PALETTE = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#393b79", "#637939")
CSP = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class Span:
    """One run of a task, from its start to its end (None: still running when asked)."""

    start: float
    end: float | None
    outcome: str  # a key of OUTCOME_COLOURS, or another state
    how: str  # "exited with code 1"


@dataclass(frozen=True)
class Event:
    """A moment of a task: start, listening, first step, restart, end."""

    time: float
    kind: str
    text: str = ""


@dataclass(frozen=True)
class Resources:
    """A task's CPU and memory over time, where its host recorded them."""

    cpu: tuple[tuple[float, float], ...] = ()  # (epoch seconds, % of one core)
    memory: tuple[tuple[float, float], ...] = ()  # (epoch seconds, bytes)


@dataclass(frozen=True)
class TaskReport:
    name: str
    address: str
    state: str
    end: str  # how it ended (or what it does now), in words
    spans: tuple[Span, ...] = ()
    events: tuple[Event, ...] = ()
    rates: tuple[tuple[float, float], ...] = ()  # (epoch seconds, steps/s)
    step: int | None = None  # the last step it logged
    restarts: int = 0
    resources: Resources | None = None
    diagnosis: tuple[str, str] | None = None  # (cause, fix)
    last_line: str = ""
    metrics: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()  # (name, (time, value)...): loss, ...
    metric_steps: tuple[tuple[str, tuple[int | None, ...]], ...] = ()  # (name, the step of each point of `metrics`)
    note: str = ""  # what its peers' progress says of it: "never logged a training step, while ..."
    tail: tuple[str, ...] = ()  # its last lines, for a task that failed or may not have trained
    cost: TaskCost | None = None
    steps: tuple[tuple[float, float], ...] = ()  # (epoch seconds, step): each step line it logged
    brief: str = ""  # how it ended in a few words, for the timeline ("" : `end`)


@dataclass(frozen=True)
class RunReport:
    run_id: str
    cluster_name: str
    cluster_file: str
    backend: str
    state: str
    reason: str | None
    started_at: float
    ended_at: float | None
    generated_at: float
    tasks: tuple[TaskReport, ...]
    unreachable: tuple[tuple[str, str], ...] = ()  # (host, why)
    notes: tuple[str, ...] = field(default=())
    commands: tuple[tuple[str, str], ...] = ()  # (task, command): one task of each job
    tf_config: str = ""  # the first task's
    env: tuple[tuple[str, str], ...] = ()  # the first task's, secrets masked, TF_CONFIG apart
    versions: tuple[tuple[str, str], ...] = ()  # ("tfctl", "0.1.0"), (host, "python 3.11, tensorflow 2.16")
    scheduler_cost: str = ""  # what the backend's scheduler recorded (its accounting), beside `cost`
    result: dict[str, Metric] = field(default_factory=dict)  # its final evaluation's numbers (`tf.results`)
    local: bool = False  # every host is this machine, reached without the backend's transport
    params: str = ""  # the parameters it ran with: `lr=0.01 batch=64`
    tracking: str = ""  # its tracker runs: `mlflow http://...`


def text(value: object) -> str:
    """Any text for the page: control characters shown (`console.inert`), then HTML-escaped."""
    return html.escape(console.inert(str(value)), quote=True)


def clock(moment: float | None) -> str:
    return "-" if moment is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))


def offset(seconds: float) -> str:
    """+75 -> `+1m15s`: a moment of the run, from its start."""
    s = int(round(seconds))
    if abs(s) < 60:
        return f"+{s}s"
    if abs(s) < 3600:
        return f"+{s // 60}m{s % 60:02d}s"
    return f"+{s // 3600}h{s % 3600 // 60:02d}m"


class Scale:
    """Epoch seconds -> x pixels over [left, right]; a subclass may scale other numbers (steps)."""

    def __init__(self, start: float, end: float, left: float, right: float) -> None:
        self.start, self.end = start, max(end, start + 1.0)
        self.left, self.right = left, right

    def x(self, moment: float) -> float:
        share = (moment - self.start) / (self.end - self.start)
        return round(self.left + min(max(share, 0.0), 1.0) * (self.right - self.left), 1)

    def ticks(self, count: int = 6) -> list[float]:
        step = nice_step((self.end - self.start) / count)
        first = self.start
        return [first + i * step for i in range(int((self.end - self.start) / step) + 1)]

    def label(self, tick: float, origin: float) -> str:
        """What a grid line says: the time since `origin` (the run's start)."""
        return offset(tick - origin)


def nice_step(rough: float) -> float:
    """A round interval near `rough` seconds: 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, hours."""
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400):
        if step >= rough:
            return float(step)
    return 86400.0 * (1 + int(rough // 86400))


def time_range(run: RunReport) -> tuple[float, float]:
    moments = [run.started_at, run.ended_at or run.generated_at]
    for task in run.tasks:
        moments += [s.start for s in task.spans] + [s.end for s in task.spans if s.end is not None]
        moments += [e.time for e in task.events]
    return min(moments), max(moments)


def render(run: RunReport) -> str:
    """The whole page."""
    scale = Scale(*time_range(run), LABEL, WIDTH - 10)  # one for every chart: times line up
    parts = [
        facts(run),
        tasks_table(run),
        "<h2>Timeline</h2>",
        timeline(run, scale),
        events_table(run),
        "<h2>Steps per second</h2>",
        steps_chart(run, scale),
        model_curves(run, scale),
    ]
    if any(t.resources is not None for t in run.tasks):
        parts.append(resources(run, scale))
    parts += [diagnosis(run), started_how(run)]
    return PAGE.format(title=text(f"tfctl report {run.run_id}"), csp=CSP, style=STYLE, body="\n".join(parts))


def facts(run: RunReport) -> str:
    rows = [
        ("run", run.run_id),
        ("cluster", f"{run.cluster_name} ({run.cluster_file})"),
        ("backend", f"localhost (every task on this machine; backend {run.backend})" if run.local else run.backend),
        ("state", run.state + (f": {run.reason}" if run.reason else "")),
        *([("params", run.params)] if run.params else []),
        *([("tracking", run.tracking)] if run.tracking else []),
        ("result", result_text(run.result) or "no final evaluation line found (see metrics: in the README)"),
        ("started", clock(run.started_at)),
        ("ended", clock(run.ended_at) if run.ended_at else "not yet"),
        ("duration", offset((run.ended_at or run.generated_at) - run.started_at).lstrip("+")),
        ("tasks", tasks_summary(run.tasks)),
        ("cost", cost_summary(run)),
        *([(f"{run.backend} accounting", run.scheduler_cost)] if run.scheduler_cost else []),
        ("versions", "; ".join(f"{who}: {version}" for who, version in run.versions) or "not recorded"),
        ("report made", clock(run.generated_at)),
    ]
    rows += [(f"unreachable {host}", why) for host, why in run.unreachable]
    cells = "".join(f"<tr><th>{text(k)}</th><td>{text(v)}</td></tr>" for k, v in rows)
    notes = "".join(f'<p class="note">{text(n)}</p>' for n in run.notes)
    return f"<h1>{text(run.run_id)}</h1><table class=facts>{cells}</table>{notes}"


def tasks_summary(tasks: Sequence[TaskReport]) -> str:
    """`50: 1 succeeded, 49 stopped`: how many ended each way, not a list of 50 words."""
    counts = Counter(t.state for t in tasks)
    return f"{len(tasks)}: " + ", ".join(f"{n} {state}" for state, n in counts.most_common())


def cost_summary(run: RunReport) -> str:
    costs = [t.cost for t in run.tasks if t.cost is not None]
    if not costs:
        return "not measured"
    total = cost_json(costs, (run.ended_at or run.generated_at) - run.started_at)["total"]
    unmeasured = f"; CPU not measured for {', '.join(total['unmeasured'])}" if total["unmeasured"] else ""
    return (
        f"wall {offset(total['wall_seconds']).lstrip('+')}, CPU {hours_text(total['cpu_hours'])}, "
        f"GPU {hours_text(total['gpu_hours'])} (per task below){unmeasured}"
    )


def tasks_table(run: RunReport) -> str:
    """One row per task: how it ended, its last step and numbers, what it cost; a task that
    failed or may not have trained gets its diagnosis beside it and its last lines under it."""
    names = metric_names(run.tasks)
    head = "".join(
        f"<th>{text(h)}</th>" for h in ("task", "address", "how it ended", "step", *names, "wall", "CPU", "GPU", "")
    )
    rows = []
    for t in run.tasks:
        last = dict((name, points[-1][1]) for name, points in t.metrics if points)
        cost = t.cost
        told = [f"<b>{text(t.diagnosis[0])}</b><br><i>fix:</i> {text(t.diagnosis[1])}"] if t.diagnosis else []
        told += [text(t.note)] if t.note else []
        cells = [
            text(t.name),
            text(t.address),
            f'<span style="color:{OUTCOME_COLOURS.get(t.state, OTHER_OUTCOME)}">&#9632;</span> {text(t.end)}',
            "-" if t.step is None else str(t.step),
            *(f"{last[n]:.4g}" if n in last else "-" for n in names),
            offset(cost.wall_seconds).lstrip("+") if cost else "-",
            hours_text(cost.cpu_hours) if cost else "-",
            hours_text(cost.gpu_hours) if cost and cost.gpus else "-",
            "<br>".join(told),
        ]
        kinds = ["n", "n", "end", "n", *("n" for _ in names), "n", "n", "n", "wrap"]
        rows.append("<tr>" + "".join(f'<td class="{k}">{c}</td>' for k, c in zip(kinds, cells)) + "</tr>")
        if t.tail:
            lines = text("\n".join(t.tail))
            quoted = f"last {len(t.tail)} lines" if len(t.tail) > 1 else "last line"
            rows.append(
                f'<tr><td colspan="{len(cells)}" class="wrap"><details{" open" if told else ""}><summary>'
                f"{text(t.name)}: its {quoted}</summary><pre>{lines}</pre></details></td></tr>"
            )
    return f"<h2>Tasks</h2><table class=tasks><tr>{head}</tr>{''.join(rows)}</table>"


def metric_names(tasks: Sequence[TaskReport], most: int = 4) -> list[str]:
    """The model's numbers most often logged (loss, accuracy, ...), at most `most`."""
    counts: Counter[str] = Counter()
    for t in tasks:
        for name, points in t.metrics:
            counts[name] += len(points)
    return [name for name, _ in counts.most_common(most)]


def steps_chart(run: RunReport, scale: Scale) -> str:
    """Steps/s over time; for a run too short for that (a few points per task: each spans
    `RATE_SPAN` seconds), the step each task logged over time, whose slope is its rate, with the
    average rate of each task said under it."""
    if any(len(t.rates) >= FEW_RATES for t in run.tasks) or not any(len(t.steps) >= 2 for t in run.tasks):
        if not any(t.rates for t in run.tasks):
            return '<p class="none">No task logged steps tfctl could read (see progress.regex in the README).</p>'
        return line_chart([(t.name, t.rates) for t in run.tasks], scale, "steps/s", run.started_at)
    averages = [f"{t.name} {rate:.3g}" for t in run.tasks if (rate := average_rate(t.steps)) is not None]
    return (
        '<p class="note">Too short a run for steps/s over time: the step each task logged instead (its slope '
        f"is the rate). Average steps/s: {text(', '.join(averages))}.</p>"
        + line_chart([(t.name, t.steps) for t in run.tasks], scale, "step", run.started_at)
    )


def average_rate(steps: Sequence[tuple[float, float]]) -> float | None:
    """Steps/s from the first to the last step line since the counter last went back (a restart)."""
    start = max((i for i in range(1, len(steps)) if steps[i][1] < steps[i - 1][1]), default=0)
    if len(steps) - start < 2 or steps[-1][0] <= steps[start][0]:
        return None
    return (steps[-1][1] - steps[start][1]) / (steps[-1][0] - steps[start][0])


def model_curves(run: RunReport, scale: Scale) -> str:
    """One chart per number the model logs with its steps (loss, accuracy), a line per task."""
    charts = []
    for name in metric_names(run.tasks):
        series = [(t.name, dict(t.metrics).get(name, ())) for t in run.tasks]
        finite = [(task, tuple(p for p in points if math.isfinite(p[1]))) for task, points in series]
        charts.append(f"<h2>{text(name)}</h2>" + line_chart(finite, scale, name, run.started_at))
    return "".join(charts)


def started_how(run: RunReport) -> str:
    """The command of each job, TF_CONFIG and the environment (secrets masked), as started."""
    if not run.commands:
        return ""
    commands = "".join(f"<tr><th>{text(task)}</th><td><pre>{text(c)}</pre></td></tr>" for task, c in run.commands)
    env = "".join(f"<tr><th>{text(k)}</th><td>{text(v)}</td></tr>" for k, v in run.env)
    return (
        f"<h2>How it was started</h2><table class=facts>{commands}"
        f"<tr><th>TF_CONFIG ({text(run.commands[0][0])})</th><td><pre>{text(run.tf_config)}</pre></td></tr>"
        f"{env}</table>"
    )


def timeline(run: RunReport, scale: Scale) -> str:
    """One row per task: a bar per run coloured by how it ended, a mark where it listened,
    stepped first and was restarted; hovering a bar says how that run ended."""
    height = 30 + ROW * len(run.tasks)
    out = [svg_open(height, "timeline of every task")]
    out += axis(scale, 18, height, run.started_at)
    for i, task in enumerate(run.tasks):
        top = 24 + i * ROW
        middle = top + ROW / 2
        out.append(f'<text x="4" y="{middle - 2}" class="name">{text(task.name)}</text>')
        brief = task.brief or task.end
        shown = brief if len(brief) <= TIMELINE_CHARS else brief[: TIMELINE_CHARS - 1] + "\u2026"
        out.append(f'<text x="4" y="{middle + 11}" class="small">{text(shown)}<title>{text(task.end)}</title></text>')
        for span in task.spans:
            x1, x2 = scale.x(span.start), scale.x(span.end if span.end is not None else run.generated_at)
            colour = OUTCOME_COLOURS.get(span.outcome, OTHER_OUTCOME)
            tip = text(f"{task.name}: {clock(span.start)} - {clock(span.end)}: {span.how}")
            out.append(
                f'<rect x="{x1}" y="{middle - BAR / 2}" width="{max(x2 - x1, 2.0):.1f}" height="{BAR}" '
                f'fill="{colour}"><title>{tip}</title></rect>'
            )
        for event in task.events:
            out.append(marker(event, scale.x(event.time), middle, task.name))
    out.append("</svg>")
    return "".join(out) + LEGEND


def marker(event: Event, x: float, y: float, task: str) -> str:
    tip = f"<title>{text(f'{task} {event.kind} at {clock(event.time)} {event.text}'.strip())}</title>"
    half = BAR / 2
    if event.kind == "listening":
        return f'<circle cx="{x}" cy="{y}" r="4" class="listen">{tip}</circle>'
    if event.kind == "first step":
        return f'<path d="M{x} {y - 5}L{x + 5} {y}L{x} {y + 5}L{x - 5} {y}Z" class="step">{tip}</path>'
    if event.kind == "restart":
        return f'<line x1="{x}" x2="{x}" y1="{y - half - 4}" y2="{y + half + 4}" class="restart">{tip}</line>'
    return f'<line x1="{x}" x2="{x}" y1="{y - half}" y2="{y + half}" class="edge">{tip}</line>'


def axis(scale: Scale, top: float, bottom: float, origin: float, labels: float | None = None) -> list[str]:
    """A grid line per round tick of `scale` (a time from the run's start), labelled at `labels`
    (default: above)."""
    out = []
    at = top - 6 if labels is None else labels
    for tick in scale.ticks():
        x = scale.x(tick)
        out.append(f'<line x1="{x}" x2="{x}" y1="{top}" y2="{bottom}" class="grid"/>')
        shown = text(scale.label(tick, origin))
        out.append(f'<text x="{x}" y="{at}" class="small" text-anchor="middle">{shown}</text>')
    return out


def svg_open(height: float, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{text(label)}">'
    )


def events_table(run: RunReport) -> str:
    rows = []
    for task in run.tasks:
        for event in sorted(task.events, key=lambda e: e.time):
            rows.append(
                f"<tr><td>{text(task.name)}</td><td>{offset(event.time - run.started_at)}</td>"
                f"<td>{text(clock(event.time))}</td><td>{text(event.kind)}</td><td>{text(event.text)}</td></tr>"
            )
    if not rows:
        return ""
    head = "<tr><th>task</th><th>at</th><th>time</th><th>event</th><th></th></tr>"
    return f"<details><summary>Every event</summary><table class=events>{head}{''.join(rows)}</table></details>"


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    scale: Scale,
    unit: str,
    origin: float,
    divide: float = 1.0,
) -> str:
    """One line per named series of (time, value) (values divided by `divide`), a legend under it."""
    top, bottom = 24.0, CHART_HEIGHT - 20.0
    peak = max((v / divide for _, points in series for _, v in points), default=0.0) or 1.0
    out = [svg_open(CHART_HEIGHT, unit)]
    out += axis(scale, top, bottom, origin, labels=bottom + 14)
    for fraction in (0.0, 0.5, 1.0):
        y = round(bottom - fraction * (bottom - top), 1)
        out.append(f'<line x1="{scale.left}" x2="{scale.right}" y1="{y}" y2="{y}" class="grid"/>')
        out.append(
            f'<text x="{scale.left - 4}" y="{y + 4}" class="small" text-anchor="end">{peak * fraction:.3g}</text>'
        )
    out.append(f'<text x="4" y="{top + 4}" class="small">{text(unit)}</text>')
    legend = []
    for i, (name, points) in enumerate(series):
        if not points:
            continue
        colour = colour_of(i)
        xy = [(scale.x(t), round(bottom - (v / divide) / peak * (bottom - top), 1)) for t, v in points]
        tip = f"<title>{text(name)}</title>"
        if len(xy) == 1:  # a line needs two points: one is drawn as what it is
            out.append(f'<circle cx="{xy[0][0]}" cy="{xy[0][1]}" r="3.5" fill="{colour}">{tip}</circle>')
        else:
            shown = " ".join(f"{x},{y}" for x, y in xy)
            out.append(f'<polyline points="{shown}" fill="none" stroke="{colour}" stroke-width="2">{tip}</polyline>')
        legend.append(f'<span style="color:{colour}">&#9632;</span> {text(name)}')
    out.append("</svg>")
    return "".join(out) + f'<p class="legend">{" &nbsp; ".join(legend)}</p>'


def colour_of(index: int) -> str:
    """The palette, then hues a golden angle apart: 50 tasks' lines all differ."""
    if index < len(PALETTE):
        return PALETTE[index]
    return f"hsl({(index - len(PALETTE)) * 137.508 % 360:.0f},65%,{38 + index % 3 * 8}%)"


def resources(run: RunReport, scale: Scale) -> str:
    """CPU and memory, drawn only when some task's host recorded them."""
    measured = [t for t in run.tasks if t.resources is not None]
    cpu = [(t.name, t.resources.cpu if t.resources else ()) for t in measured]
    memory = [(t.name, t.resources.memory if t.resources else ()) for t in measured]
    return (
        '<h2 id="resources">CPU / memory</h2>'
        + line_chart(cpu, scale, "CPU % of one core", run.started_at)
        + line_chart(memory, scale, "memory MiB", run.started_at, divide=1024 * 1024)
    )


def diagnosis(run: RunReport) -> str:
    """What tfctl recognised in the logs; first, for tasks that failed, what failed, in order."""
    found = [(t.name, t.diagnosis) for t in run.tasks if t.diagnosis is not None]
    failed = what_failed(run)
    if not found and not failed:
        return "<h2>Diagnosis</h2><p class=none>tfctl found nothing wrong in the tasks' logs.</p>"
    items = "".join(
        f"<li><b>{text(name)}</b>: {text(cause)}<br><i>fix:</i> {text(fix)}</li>" for name, (cause, fix) in found
    )
    known = f"<ul class=diagnosis>{items}</ul>" if found else "<p class=none>No known TensorFlow error in the logs.</p>"
    return f"<h2>Diagnosis</h2>{failed}{known}"


def what_failed(run: RunReport) -> str:
    """Every task that failed (or was lost), the first first: how it ended and its last error line."""
    ends = sorted(
        (moment, t.name, t) for t in run.tasks if (moment := failed_at(t, run.ended_at or run.generated_at)) is not None
    )
    items = []
    for i, (moment, name, t) in enumerate(ends):
        line = last_error(t.tail) or t.last_line
        said = f"; its last error line: <code>{text(line)}</code>" if line else ""
        first = " failed first," if i == 0 and len(ends) > 1 else " failed"
        items.append(f"<li><b>{text(name)}</b>{first} at {offset(moment - run.started_at)}: {text(t.end)}{said}</li>")
    return f"<p>What failed:</p><ul class=failed>{''.join(items)}</ul>" if items else ""


def failed_at(task: TaskReport, otherwise: float) -> float | None:
    """When the task first failed (a run of it that ended badly), None if it never did."""
    bad = [s.end for s in task.spans if s.outcome in ("failed", "lost") and s.end is not None]
    if bad:
        return min(bad)
    return otherwise if task.state in ("failed", "lost") else None


ERROR_LINE = re.compile(r"(?i)error|exception|fatal|abort|killed|failed")


def last_error(lines: Sequence[str]) -> str:
    """The last line of a task's tail that reads as an error (not the `Traceback` heading)."""
    return next((ln for ln in reversed(lines) if ERROR_LINE.search(ln) and not ln.startswith("Traceback")), "")


LEGEND = (
    '<p class="legend">Bars: <b style="color:#2b2b2b">one per run of the task</b> - green succeeded, red '
    "failed, amber stopped, blue running, grey unknown. &#9675; listening, &#9670; first step, tall "
    "black line: restarted. Hover a bar or a mark for its times.</p>"
)

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 16px; margin: 18px 0 6px; }
table.facts th { text-align: left; padding-right: 14px; color: #555; font-weight: normal; vertical-align: top; }
pre, p, li, td.wrap { overflow-wrap: anywhere; } pre { white-space: pre-wrap; margin: 0; font-size: 12px; }
td.n { white-space: nowrap; } td.end { min-width: 12em; }
table.tasks { border-collapse: collapse; font-size: 12px; width: 100%; }
table.tasks td, table.tasks th { padding: 2px 8px 2px 0; text-align: left; vertical-align: top; }
table.tasks tr:nth-child(even) { background: #f6f6f6; } svg { max-width: 100%; height: auto; }
table.events { border-collapse: collapse; font-size: 12px; }
table.events td, table.events th { padding: 1px 10px 1px 0; text-align: left; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg text.small { font-size: 10px; fill: #666; } svg text.name { font-weight: 600; }
.grid { stroke: #e4e4e4; } .edge { stroke: #222; stroke-width: 1; }
.restart { stroke: #111; stroke-width: 3; } .listen { fill: #fff; stroke: #111; stroke-width: 1.5; }
.step { fill: #111; } .legend, .none, .note { color: #555; font-size: 12px; }
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title><style>{style}</style></head>
<body>
{body}
</body></html>
"""
