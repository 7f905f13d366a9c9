"""`status` as a person sees it: the table, and the notes under it, rendered from a `Snapshot` by
the process that has the terminal (the run's live controller sends the snapshot as data)."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from rich.console import Group
from rich.text import Text

from tfctl import console
from tfctl.config.model import host_port
from tfctl.controller.views.status_view import Snapshot, host_problems
from tfctl.engine.observed import TaskStatus
from tfctl.runs.record import RunRecord
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import Finding
from tfctl.tf.doctor import RunDiagnosis
from tfctl.tf.progress import TaskProgress, never_stepped, unread_progress
from tfctl.tf.results import result_text
from tfctl.tf.silence import Silence


def number_ranges(numbers: Sequence[int], separator: str = ", ") -> str:
    """2222, 2223, 2224, 2230 -> '2222-2224, 2230'; cores with separator "," -> `0-3,6`, as
    /proc's Cpus_allowed_list and taskset write them."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return separator.join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def state_style(state: str) -> str:
    return {
        TaskState.RUNNING: "green",
        TaskState.SUCCEEDED: "green",
        TaskState.STOPPED: "yellow",
        TaskState.PENDING: "dim",
        TaskState.STARTING: "cyan",
        TaskState.RESTARTING: "yellow",
    }.get(TaskState(state), "red")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def unreachable_text(since: float) -> str:
    """` (since 12:03:04, 41s)`: when the run's controller last heard from the host, and how long ago."""
    return f" (since {time.strftime('%H:%M:%S', time.localtime(since))}, {duration(time.time() - since)})"


def moved_text(record: RunRecord, task: str) -> str:
    """`, moved from h2 at 12:03:07` for a task that now runs on a spare."""
    last = next((m for m in reversed(record.moves) if m.task == task), None)
    return (
        "" if last is None else f", moved from {last.from_host} at {time.strftime('%H:%M:%S', time.localtime(last.at))}"
    )


def gpus_text(status: TaskStatus) -> str:
    """A task's GPUs as CUDA_VISIBLE_DEVICES names them; `none` when they are hidden from it."""
    if status.gpus is None:
        return "-"
    return ",".join(map(str, status.gpus)) or "none"


def rate_text(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"


def status_text(shot: Snapshot, record: RunRecord) -> str:
    """The table as this process's stdout prints it (it may have been resized since the last one)."""
    traits = console.stdout_traits()
    return console.shown(console.rendered(status_table(shot, record, traits["width"]), traits))


def status_table(shot: Snapshot, record: RunRecord, console_width: int) -> Any:
    from rich.table import Table

    statuses, unreachable, found = shot.statuses, shot.unreachable, shot.diagnosis
    title = f"{record.run_id}  ({record.state}" + (f": {record.reason}" if record.reason else "") + ")"
    if record.resumes:
        title += f"  resumes {record.resumes}"
    if record.params:
        title += f"  params {record.params_text()}"
    if record.tracking_text():
        title += f"  {record.tracking_text()}"
    if shot.backend is not None:
        title += f"  {shot.backend.line()}"
    if record.allocation_text():
        title += f"  {record.allocation_text()}"

    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    # Device columns only for runs that place devices: (heading, a task's cell).
    device_columns: list[tuple[str, Callable[[TaskStatus], str]]] = []
    if any(s.gpus is not None for s in statuses):
        device_columns.append(("GPUS", gpus_text))
    if any(s.cpus is not None for s in statuses):
        device_columns.append(("CPUS", lambda s: number_ranges(s.cpus, ",") if s.cpus else "-"))
    progress_columns: list[tuple[str, Callable[[TaskStatus], str]]] = []
    if any(shot.progress[s.task].epoch is not None for s in statuses):
        progress_columns.append(("EPOCH", lambda s: str(shot.progress[s.task].epoch or "-")))
    rows = []
    for s in statuses:
        exit_text = (
            "-" if s.exit_code is None and s.signal is None else (f"sig {s.signal}" if s.signal else str(s.exit_code))
        )
        listen = "yes" if s.listening else ("no" if s.state.value == "running" else "-")
        p = shot.progress[s.task]
        rows.append(
            [
                s.task,
                host_port(s.host, s.port),
                s.state.value
                + "".join(f", {flag}" for flag in p.flags if flag != "restarting")
                + (f" ({s.restarts}x restarted)" if s.restarts else "")
                + moved_text(record, s.task)
                + (unreachable_text(s.unreachable_since) if s.unreachable_since else "")
                + (", not yet recorded" if s.unrecorded else "")
                + (f", {s.host_problem.split(' (')[0]}" if s.host_problem else ""),
                str(s.pid or "-"),
                exit_text,
                duration(s.uptime),
                listen,
                *(cell(s) for _, cell in progress_columns),
                "-" if p.step is None else str(p.step),
                rate_text(p.steps_per_sec),
                *(cell(s) for _, cell in device_columns),
                console.inert(s.last_line)[:300],  # task output: shown, never obeyed
            ]
        )
    columns = (
        *("TASK", "ADDRESS", "STATE", "PID", "EXIT", "UPTIME", "LISTEN"),
        *(heading for heading, _ in progress_columns),
        *("STEP", "STEPS/S"),
        *(heading for heading, _ in device_columns),
        "LAST LINE",
    )
    widths = [max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(columns)]
    # Every column keeps its full width; only the last line is cut to what the screen has left.
    widths[-1] = max(12, min(widths[-1], console_width - sum(widths[:-1]) - 2 * (len(columns) - 1)))
    for col, width in zip(columns, widths):
        table.add_column(col, no_wrap=True, overflow="ellipsis", min_width=width, max_width=width)
    for row in rows:
        table.add_row(
            *row[:2], Text(row[2], style=state_style(row[2].split()[0].rstrip(","))), *row[3:-1], Text(row[-1])
        )
    captions = [f"unreachable: {host}: {why}" for host, why in sorted(unreachable.items())]
    captions += [f"{host}: {problem}" for host, problem in sorted(host_problems(statuses).items())]
    captions += [f"{s.task} {s.describe_end()}" for s in statuses if s.state is TaskState.LOST and s.error]
    if captions:
        table.caption = "\n".join(captions)
    notes = [Text("result: ", style="bold") + Text(console.inert(result_text(shot.result)))] if shot.result else []
    notes += [finding_text(task, f) for task, f in found.findings.items()]
    notes += never_ready_notes(found)
    notes += untrained_notes(shot.statuses, shot.progress, shot.silent, ended=not record.active)
    notes += unread_progress_notes(shot.statuses, shot.progress)
    return Group(table, *notes) if notes else table


def unread_progress_notes(statuses: list[TaskStatus], progress: dict[str, TaskProgress]) -> list[Text]:
    """One note for the training tasks whose output tfctl cannot read progress from, and how to
    tell it what progress looks like."""
    unread = unread_progress(statuses, progress)
    if not unread:
        return []
    return [
        Text(f"{', '.join(unread)}: ", style="bold yellow")
        + Text("print, but no line reads as a step or an epoch")
        + Text("\n  fix: ", style="bold")
        + Text(
            "set `progress: {regex: '...(?P<step>\\d+)...'}` in the cluster file to a pattern of your progress lines"
        )
    ]


def never_ready_notes(found: RunDiagnosis, skip: str | None = None) -> list[Any]:
    """The ended tasks whose log ends in a wait TF never gave up: they never trained, whatever
    the run's outcome says (a success policy that watches the chief only)."""
    return [
        note_text(task, f"never got past waiting: {f.cause}", f.fix)
        for task, f in found.never_ready.items()
        if task != skip
    ]


def untrained_notes(
    statuses: list[TaskStatus], progress: dict[str, TaskProgress], silent: Mapping[str, Silence], ended: bool = True
) -> list[Any]:
    """The tasks that printed nothing while their peers went on, with what TF most likely waits
    for; then those that ended without a step while their peers logged some."""
    notes = [note_text(task, f"{s.text(ended, named=False)}; {s.cause}", s.fix) for task, s in silent.items()]
    return notes + [
        Text(f"{task}: ", style="bold yellow")
        + Text(f"never logged a training step, while {', '.join(peers)} did: it may not have trained")
        for task, peers in never_stepped(statuses, progress).items()
        if task not in silent
    ]


def finding_text(task: str, finding: Finding) -> Any:
    return note_text(task, finding.cause, finding.fix)


def note_text(task: str, cause: str, fix: str) -> Any:
    return Text(f"{task}: ", style="bold yellow") + Text(cause) + Text("\n  fix: ", style="bold") + Text(fix)
