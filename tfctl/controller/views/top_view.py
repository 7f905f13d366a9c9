"""`tfctl top` as a person sees it: every task's CPU, memory, GPU, steps/s and last line, with a
short history, per-job totals, sorted and coloured so the slow or hungry task stands out.

Pure: data in, text out, fitted to the terminal's width and height, so each layout is tested
as text (tests/test_top.py).

Drawn from `status --json`'s object (with usage history), so the screen is the same whether the
run's live controller answered or this process asked the hosts.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from rich.cells import cell_len
from rich.text import Text

from tfctl import console
from tfctl.controller.views.status_table import duration, rate_text, state_style

SPARKS = "▁▂▃▄▅▆▇█"
HISTORY = 20  # samples in each sparkline: a minute at the monitors' pace
HUNGRY = 1.5  # a task using this many times the median of the run's tasks stands out
LAGGING = {
    "straggler": "a straggler: under half its job's median steps/s",
    "stalled": "stalled: no step for a while in a job that steps",
}

SORTS: dict[str, tuple[str, bool]] = {  # --sort: (JSON key, largest first)
    "cpu": ("cpu_percent", True),
    "mem": ("rss_bytes", True),
    "gpu": ("gpu_util_percent", True),
    "rate": ("steps_per_sec", False),  # slowest first
    "task": ("task", False),
}
SORT_ORDER = tuple(SORTS)  # the order the `s` key cycles through


KEYS = {"P": "cpu", "M": "mem"}  # as htop sorts; `s` cycles through SORT_ORDER, `q` quits


def answer_key(key: str, sort: str) -> str | None:
    """The sort after `key` is pressed; None: quit. Other keys change nothing."""
    if key in ("q", "Q"):
        return None
    if key == "s":
        return SORT_ORDER[(SORT_ORDER.index(sort) + 1) % len(SORT_ORDER)]
    return KEYS.get(key, sort)


def sparkline(values: list[float], top: float | None = None) -> str:
    """One block per value, scaled to `top` (default: the largest value)."""
    if not values:
        return ""
    ceiling = max(top or 0.0, *values) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / ceiling * len(SPARKS)))] for v in values)


def size_text(count: float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" or count >= 100 else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def percent_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def sort_tasks(tasks: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Tasks ordered by `by` (a key of SORTS); tasks without the value (not running) last."""
    key, largest_first = SORTS[by]
    known = [t for t in tasks if t.get(key) is not None]
    unknown = [t for t in tasks if t.get(key) is None]
    return sorted(known, key=lambda t: t[key], reverse=largest_first) + unknown


def hungry(tasks: list[dict[str, Any]], key: str) -> set[str]:
    """Tasks whose `key` is well above the median of the tasks that report it."""
    values = [t[key] for t in tasks if t.get(key) is not None]
    if len(values) < 2:
        return set()
    middle = statistics.median(values)
    return {t["task"] for t in tasks if t.get(key) is not None and t[key] > max(HUNGRY * middle, 1.0)}


@dataclass(frozen=True)
class Column:
    """One column of the screen. The narrower the terminal, the more columns go, highest
    `drop_order` first: the histories before the numbers they draw, the task name last."""

    heading: str
    drop_order: int
    cell: Callable[[dict[str, Any]], Text]
    right: bool = False


LAST_MIN = 12  # the last line's column, which takes what width is left, needs this much or goes
KEYS_HELP = "s: sort by {next}   P: by CPU   M: by memory   q: quit"


def top_screen(
    data: dict[str, Any], sort: str = "cpu", width: int = 120, height: int | None = None, keys: bool = False
) -> Text:
    """The screen for one `status --json` object with usage history, fitted to `width` columns
    and (unless None) `height` lines: the tasks that do not fit become one "N more" line.
    `keys`: the screen answers keys (`s`, `q`), and says so on its last line."""
    run, tasks = data["run"], sort_tasks(list(data["tasks"]), sort)
    marked = {key: hungry(tasks, key) for key in ("cpu_percent", "rss_bytes", "gpu_memory_bytes")}
    # Slow as `status` flags it (`tf.progress`): a straggler of its job, or stalled.
    lagging = {t["task"]: flag for t in tasks for flag in t.get("flags", ()) if flag in ("straggler", "stalled")}
    cpu_total = sum(t.get("cpu_percent") or 0.0 for t in tasks)
    rss_total = sum(t.get("rss_bytes") or 0 for t in tasks)
    title = Text(
        f"{run['id']}  ({run['state']})  {len(tasks)} tasks  cpu {cpu_total:.0f}%  rss {size_text(rss_total)}"
        f"  sorted by {sort}  {time.strftime('%H:%M:%S')}",
        style="bold",
    )
    columns = _columns(tasks, marked, set(lagging))
    totals = job_totals(tasks)
    notes = [Text(f"{task}: ", style="bold red") + Text(LAGGING[flag]) for task, flag in lagging.items()]
    notes += [
        Text(f"{task}: ", style="bold red") + Text(f"uses more {what} than the run's other tasks")
        for key, what in (("cpu_percent", "CPU"), ("rss_bytes", "memory"), ("gpu_memory_bytes", "GPU memory"))
        for task in sorted(marked[key])
    ]
    unreachable = run.get("unreachable_hosts") or {}
    notes += [Text(f"unreachable: {host}: {why}", style="red") for host, why in sorted(unreachable.items())]
    if keys:
        following = SORT_ORDER[(SORT_ORDER.index(sort) + 1) % len(SORT_ORDER)]
        notes.append(Text(KEYS_HELP.format(next=following), style="dim"))
    shown = tasks
    if height is not None:  # title, headings, the job totals (and their rule), the notes
        room = height - 2 - (len(totals) + 1 if totals else 0) - len(notes)
        if len(tasks) > room:
            shown = tasks[: max(room - 1, 0)]
    cells = [[c.cell(t) for c in columns] for t in [*shown, *totals]]
    kept, widths = fit(columns, cells, width)
    lines = [title, _row([Text(c.heading) for c in kept], kept, widths, "bold")]
    lines += [_row([row[columns.index(c)] for c in kept], kept, widths) for row in cells[: len(shown)]]
    if len(shown) < len(tasks):
        hidden = len(tasks) - len(shown)
        lines.append(Text(f"… {hidden} more task{'s' if hidden != 1 else ''} below (sorted by {sort})", style="dim"))
    if totals:
        lines.append(Text("─" * min(width, sum(widths) + 2 * (len(widths) - 1)), style="dim"))
        lines += [_row([row[columns.index(c)] for c in kept], kept, widths, "bold") for row in cells[len(shown) :]]
    lines += notes
    for line in lines:
        line.rstrip()
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)


def _columns(tasks: list[dict[str, Any]], marked: dict[str, set[str]], lagging: set[str]) -> list[Column]:
    # Memory histories share one scale, the run's largest, so the hungry task's line stands tallest.
    rss_top = max((v for t in tasks for v in _history(t, "rss_bytes")), default=0.0)
    gpus = any(t.get("gpu_util_percent") is not None or t.get("gpu_memory_bytes") is not None for t in tasks)
    gpu_hungry = marked["gpu_memory_bytes"]
    columns = [
        Column("TASK", 0, lambda t: Text(t["task"])),
        Column("HOST", 8, lambda t: Text(t.get("host", ""))),
        Column("STATE", 1, lambda t: Text(t["state"], style=state_style(t["state"]) if t.get("job") else "")),
        Column("CPU", 2, lambda t: _marked(percent_text(t.get("cpu_percent")), t, marked["cpu_percent"]), True),
        Column("CPU HISTORY", 11, lambda t: Text(sparkline(_history(t, "cpu_percent"), 100.0), style="cyan")),
        Column("RSS", 3, lambda t: _marked(size_text(t.get("rss_bytes")), t, marked["rss_bytes"]), True),
        Column("RSS HISTORY", 12, lambda t: Text(sparkline(_history(t, "rss_bytes"), rss_top), style="magenta")),
    ]
    if gpus:
        columns += [
            Column("GPU", 6, lambda t: Text(percent_text(t.get("gpu_util_percent"))), True),
            Column("GPU MEM", 7, lambda t: _marked(size_text(t.get("gpu_memory_bytes")), t, gpu_hungry)),
        ]
    columns += [
        Column("STEP", 4, lambda t: Text("-" if t.get("step") is None else str(t["step"])), True),
        Column("STEPS/S", 5, lambda t: _marked(rate_text(t.get("steps_per_sec")), t, lagging), True),
        Column("UPTIME", 9, lambda t: Text("" if t.get("uptime") == "" else duration(t.get("uptime")))),
        Column("LAST LINE", 10, lambda t: Text(console.inert(t.get("last_line") or ""), style="dim")),
    ]
    return columns


def fit(columns: list[Column], cells: list[list[Text]], width: int) -> tuple[list[Column], list[int]]:
    """The columns that fit in `width` (two spaces between each), dropping the highest
    `drop_order` first, and their widths; the last line's column takes what is left."""
    natural = {
        c.heading: max([cell_len(c.heading), *(cell_len(row[i].plain) for row in cells)]) for i, c in enumerate(columns)
    }
    kept = list(columns)
    last = kept[-1]

    def used(cols: list[Column]) -> int:
        return sum(natural[c.heading] for c in cols if c is not last) + 2 * (len(cols) - 1)

    for column in sorted(columns, key=lambda c: -c.drop_order):
        spare = width - used(kept)
        if last in kept and spare >= LAST_MIN:
            break
        if last not in kept and spare >= 0:
            break
        if column.drop_order == 0:
            break
        kept.remove(column)
    widths = [natural[c.heading] for c in kept]
    if last in kept:
        widths[-1] = min(natural[last.heading], max(width - used(kept), LAST_MIN))
    return kept, widths


def _row(cells: list[Text], kept: list[Column], widths: list[int], style: str = "") -> Text:
    line = Text(style=style)
    for i, (cell, column, size) in enumerate(zip(cells, kept, widths)):
        cell = cell.copy()
        cell.truncate(size, overflow="ellipsis")
        pad = " " * (size - cell.cell_len)
        line += Text(pad) + cell if column.right else cell + Text(pad if i < len(kept) - 1 else "")
        if i < len(kept) - 1:
            line += "  "
    return line


def job_totals(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per job of more than one task: its tasks counted by state, their CPU, memory and
    GPU memory summed, their steps/s summed (the job's throughput), its highest step."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        jobs.setdefault(t.get("job") or t["task"].split(":")[0], []).append(t)
    rows = []
    for job, members in sorted(jobs.items()):
        if len(members) < 2:
            continue
        states = Counter(t["state"] for t in members)

        def total(key: str, members: list[dict[str, Any]] = members) -> float | None:
            values = [t[key] for t in members if t.get(key) is not None]
            return sum(values) if values else None

        steps = [t["step"] for t in members if t.get("step") is not None]
        rows.append(
            {
                "task": f"{job} ×{len(members)}",
                "host": "",
                "state": " ".join(f"{n} {state}" for state, n in states.most_common()),
                "cpu_percent": total("cpu_percent"),
                "rss_bytes": total("rss_bytes"),
                "gpu_util_percent": None,
                "gpu_memory_bytes": total("gpu_memory_bytes"),
                "step": max(steps) if steps else None,
                "steps_per_sec": total("steps_per_sec"),
                "uptime": "",
            }
        )
    return rows


def _history(task: dict[str, Any], key: str) -> list[float]:
    return [u[key] for u in task.get("usage_history", [])[-HISTORY:] if u.get(key) is not None]


def _marked(text: str, task: dict[str, Any], standing_out: set[str]) -> Text:
    return Text(text, style="bold red" if task["task"] in standing_out else "")
