"""`tfctl top` as a person sees it: every task's CPU, memory, GPU and steps/s, with a short
history, sorted and coloured so the slow or hungry task stands out.

Drawn from `status --json`'s object (with usage history), so the screen is the same whether the
run's live controller answered or this process asked the hosts.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tfctl.controller.status_view import duration, rate_text, state_style

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


def top_view(data: dict[str, Any], sort: str = "cpu") -> Any:
    """The screen for one `status --json` object with usage history."""
    run, tasks = data["run"], sort_tasks(list(data["tasks"]), sort)
    gpus = any(t.get("gpu_util_percent") is not None or t.get("gpu_memory_bytes") is not None for t in tasks)
    marked = {key: hungry(tasks, key) for key in ("cpu_percent", "rss_bytes", "gpu_memory_bytes")}
    # Slow as `status` flags it (`tf.progress`): a straggler of its job, or stalled.
    lagging = {t["task"]: flag for t in tasks for flag in t.get("flags", ()) if flag in ("straggler", "stalled")}
    # Memory histories share one scale, the run's largest, so the hungry task's line stands tallest.
    rss_top = max((v for t in tasks for v in _history(t, "rss_bytes")), default=0.0)
    cpu_total = sum(t.get("cpu_percent") or 0.0 for t in tasks)
    rss_total = sum(t.get("rss_bytes") or 0 for t in tasks)
    title = (
        f"{run['id']}  ({run['state']})  {len(tasks)} tasks  cpu {cpu_total:.0f}%  rss {size_text(rss_total)}"
        f"  sorted by {sort}  {time.strftime('%H:%M:%S')}"
    )
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    columns: list[tuple[str, Callable[[dict[str, Any]], Text]]] = [
        ("TASK", lambda t: Text(t["task"])),
        ("HOST", lambda t: Text(t["host"])),
        ("STATE", lambda t: Text(t["state"], style=state_style(t["state"]))),
        ("CPU", lambda t: _marked(percent_text(t.get("cpu_percent")), t, marked["cpu_percent"])),
        ("CPU HISTORY", lambda t: Text(sparkline(_history(t, "cpu_percent"), 100.0), style="cyan")),
        ("RSS", lambda t: _marked(size_text(t.get("rss_bytes")), t, marked["rss_bytes"])),
        ("RSS HISTORY", lambda t: Text(sparkline(_history(t, "rss_bytes"), rss_top), style="magenta")),
    ]
    if gpus:
        columns += [
            ("GPU", lambda t: Text(percent_text(t.get("gpu_util_percent")))),
            ("GPU MEM", lambda t: _marked(size_text(t.get("gpu_memory_bytes")), t, marked["gpu_memory_bytes"])),
        ]
    columns += [
        ("STEP", lambda t: Text("-" if t.get("step") is None else str(t["step"]))),
        ("STEPS/S", lambda t: _marked(rate_text(t.get("steps_per_sec")), t, set(lagging))),
        ("UPTIME", lambda t: Text(duration(t.get("uptime")))),
    ]
    for heading, _ in columns:
        table.add_column(heading, no_wrap=True, justify="right" if heading in ("CPU", "RSS", "STEPS/S") else "left")
    for t in tasks:
        table.add_row(*(cell(t) for _, cell in columns))
    notes = [Text(f"{task}: ", style="bold red") + Text(LAGGING[flag]) for task, flag in lagging.items()]
    notes += [
        Text(f"{task}: ", style="bold red") + Text(f"uses more {what} than the run's other tasks")
        for key, what in (("cpu_percent", "CPU"), ("rss_bytes", "memory"), ("gpu_memory_bytes", "GPU memory"))
        for task in sorted(marked[key])
    ]
    unreachable = run.get("unreachable_hosts") or {}
    notes += [Text(f"unreachable: {host}: {why}", style="red") for host, why in sorted(unreachable.items())]
    return Group(table, *notes) if notes else table


def _history(task: dict[str, Any], key: str) -> list[float]:
    return [u[key] for u in task.get("usage_history", [])[-HISTORY:] if u.get(key) is not None]


def _marked(text: str, task: dict[str, Any], standing_out: set[str]) -> Text:
    return Text(text, style="bold red" if task["task"] in standing_out else "")
