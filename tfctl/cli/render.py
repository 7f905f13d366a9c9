"""How tfctl shows things to people: status tables, stop summaries, log lines and diagnoses.

Imported by the CLI's verbs only (never at `tfctl --help`), so it may import rich at once.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Sequence

from rich.console import Group
from rich.text import Text

from tfctl import console
from tfctl.backends.slurm.allocation import JobState, describe, job_state
from tfctl.cluster.output import Prefixer
from tfctl.cluster.supervisors import Cluster, StopReport, TaskStatus
from tfctl.config.model import host_port
from tfctl.controller.rpc_messages import StatusAsk, StatusReply
from tfctl.runs.record import RunRecord
from tfctl.supervisor.protocol import TaskState
from tfctl.tf.diagnose import Finding
from tfctl.tf.doctor import TAIL_LINES, LiveNotes, RunDiagnosis, diagnose_run, finding_json
from tfctl.tf.progress import RunProgress, TaskProgress, never_stepped


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


def stop_summary(report: StopReport) -> str:
    hosts = f"{report.hosts} host{'s' if report.hosts != 1 else ''}"
    remain = sum(len(p) for p in report.remaining.values())
    text = f"{report.processes} process{'es' if report.processes != 1 else ''} stopped on {hosts}; {remain} remain"
    if report.ports:
        word = "port" if len(report.ports) == 1 else "ports"
        text += f"; {word} {number_ranges(report.ports)} " + ("free" if not report.busy_ports else "NOT free")
    return text


def render_stop(report: StopReport) -> None:
    console.err().print(stop_summary(report))
    for host, pids in report.remaining.items():
        console.err().print(f"[red]{host}: still running: pids {', '.join(map(str, pids))}[/red]")
    for address, pids in report.busy_ports.items():
        console.err().print(f"[red]{address}: still listening (pids {', '.join(map(str, pids)) or '?'})[/red]")
    for host, why in report.unreachable.items():
        console.err().print(f"[red]{host}: could not be checked: {why}[/red]")


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


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything `status` shows, asked for once."""

    statuses: list[TaskStatus]
    unreachable: dict[str, Exception]
    diagnosis: RunDiagnosis
    progress: dict[str, TaskProgress]
    allocation: JobState | None = None  # backend slurm: what Slurm says of the run's job

    def to_json(self, record: RunRecord) -> dict[str, Any]:
        run = {
            "id": record.run_id,
            "cluster": record.cluster_name,
            "file": record.cluster_file,
            "state": record.state.value,
            "reason": record.reason,
            "started_at": record.created_at,
            "ended_at": record.ended_at,
            "unreachable_hosts": {host: str(getattr(e, "message", e)) for host, e in sorted(self.unreachable.items())},
        }
        if record.allocation is not None and self.allocation is not None:
            run["slurm"] = {**record.allocation, "state": self.allocation.state, "reason": self.allocation.reason}
        tasks = []
        for s in self.statuses:
            p = self.progress[s.task]
            tasks.append(
                {
                    **s.to_json(),
                    "step": p.step,
                    "steps_per_sec": p.steps_per_sec,
                    "flags": list(p.flags),
                    "diagnosis": finding_json(self.diagnosis.findings.get(s.task)),
                }
            )
        return {"run": run, "tasks": tasks}


def snapshot(cluster: Cluster) -> Snapshot:
    progress = RunProgress(cluster.record.progress)
    statuses, unreachable = cluster.status(progress=progress.rule(), tail=TAIL_LINES)
    found = diagnose_run(cluster, statuses)
    statuses = [dataclasses.replace(s, last_line=found.last_lines.get(s.task) or s.last_line) for s in statuses]
    allocation = None
    if cluster.record.allocation is not None:
        allocation = job_state(cluster.record.allocation["job_id"])
    return Snapshot(statuses, unreachable, found, progress.assess(statuses), allocation)


def gpus_text(status: TaskStatus) -> str:
    """A task's GPUs as CUDA_VISIBLE_DEVICES names them; `none` when they are hidden from it."""
    if status.gpus is None:
        return "-"
    return ",".join(map(str, status.gpus)) or "none"


def rate_text(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"


def status_answer(cluster: Cluster, record: RunRecord, request: StatusAsk) -> StatusReply:
    """`status`, asked here or of the run's live controller from another terminal (see `rpc`):
    the JSON, or the table as that terminal's console would print it (`console.stdout_traits`)."""
    shot = snapshot(cluster)
    if request.json:
        return StatusReply(json=shot.to_json(record))
    if request.console is None:
        raise ValueError("a status table needs the terminal to render it for")
    traits = request.console
    return StatusReply(text=console.rendered(status_table(shot, record, traits.width), traits.to_wire()))


def status_table(shot: Snapshot, record: RunRecord, console_width: int) -> Any:
    from rich.table import Table

    statuses, unreachable, found = shot.statuses, shot.unreachable, shot.diagnosis
    title = f"{record.run_id}  ({record.state}" + (f": {record.reason}" if record.reason else "") + ")"
    if record.allocation is not None and shot.allocation is not None:
        title += f"  slurm job {record.allocation['job_id']}: {describe(shot.allocation)}"

    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    # Device columns only for runs that place devices: (heading, a task's cell).
    device_columns: list[tuple[str, Callable[[TaskStatus], str]]] = []
    if any(s.gpus is not None for s in statuses):
        device_columns.append(("GPUS", gpus_text))
    if any(s.cpus is not None for s in statuses):
        device_columns.append(("CPUS", lambda s: number_ranges(s.cpus, ",") if s.cpus else "-"))
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
                + (f" {duration(time.time() - s.unreachable_since)}" if s.unreachable_since else ""),
                str(s.pid or "-"),
                exit_text,
                duration(s.uptime),
                listen,
                "-" if p.step is None else str(p.step),
                rate_text(p.steps_per_sec),
                *(cell(s) for _, cell in device_columns),
                s.last_line[:300],
            ]
        )
    columns = (
        *("TASK", "ADDRESS", "STATE", "PID", "EXIT", "UPTIME", "LISTEN", "STEP", "STEPS/S"),
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
    if unreachable:
        table.caption = "\n".join(
            f"unreachable: {host}: {getattr(e, 'message', e)}" for host, e in sorted(unreachable.items())
        )
    notes = [finding_text(task, f) for task, f in found.findings.items()]
    notes += untrained_notes(shot.statuses, shot.progress)
    return Group(table, *notes) if notes else table


def untrained_notes(statuses: list[TaskStatus], progress: dict[str, TaskProgress]) -> list[Text]:
    return [
        Text(f"{task}: ", style="bold yellow")
        + Text(f"never logged a training step, while {', '.join(peers)} did: it may not have trained")
        for task, peers in never_stepped(statuses, progress).items()
    ]


def finding_text(task: str, finding: Finding) -> Any:
    return note_text(task, finding.cause, finding.fix)


def note_text(task: str, cause: str, fix: str) -> Any:
    return Text(f"{task}: ", style="bold yellow") + Text(cause) + Text("\n  fix: ", style="bold") + Text(fix)


def print_lines(batch: list[tuple[str, str]], prefix: Prefixer, notes: LiveNotes | None) -> None:
    """Task lines to stdout, prefixed; the explanation of a known TF pattern that lasted to stderr."""
    print_blocks([(task, [line]) for task, line in batch], prefix, notes)


def print_blocks(blocks: list[tuple[str, list[str]]], prefix: Prefixer, notes: LiveNotes | None) -> None:
    """`print_lines` for blocks of one task's lines (`LogFollower.blocks`): no work per line
    but the notes' (the joins are C's)."""
    sys.stdout.write(prefix.text(blocks))
    if notes is not None:
        for task, lines in blocks:
            for line in lines:
                notes.feed(task, line)
    sys.stdout.flush()
    for task, finding in notes.due() if notes is not None else ():
        console.err().print(finding_text(task, finding))
